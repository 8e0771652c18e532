"""The ports test servers bind by number (tests/support/ports.py): outside the kernel's
ephemeral range, never twice, and each pytest worker from a share of its own."""

from __future__ import annotations

import ports


def test_ports_are_outside_the_ephemeral_range_and_never_given_twice() -> None:
    ephemeral = ports._ephemeral()
    drawn = [ports.free_port() for _ in range(50)]
    assert len(set(drawn)) == len(drawn)
    assert not any(p in ephemeral for p in drawn)
    assert all(p in ports._RANGE for p in drawn)


def test_two_workers_draw_from_disjoint_shares(monkeypatch) -> None:
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "2")
    shares = []
    for worker in ("gw0", "gw1"):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
        shares.append({ports.free_port() for _ in range(30)})
    assert not shares[0] & shares[1]
    assert {p % 2 for p in shares[0]} == {0} and {p % 2 for p in shares[1]} == {1}
