"""api/e2b/watch_listing.py: what a directory watcher keeps of a 10,000-entry listing is
bounded (hashes and compressed paths, not the listing), the events from it are still
envd's (create, write, remove, a rename as both, names not in UTF-8 too), and a listing
whose paths will not compress (a hostile tenant's random names) is refused, not kept."""

from __future__ import annotations

import asyncio
import secrets
import tracemalloc
from types import SimpleNamespace

import pytest

from sandbox_workspace.api.e2b import watchers
from sandbox_workspace.api.e2b.watch_listing import (
    MAX_HELD_BYTES,
    DirectoryTooLarge,
    Snapshot,
    changes,
)
from sandbox_workspace.api.identity import Caller
from sandbox_workspace.api.quotas import Quotas, UserLimits

ENTRIES = 10_000


def big_listing() -> dict[str, tuple[int, str]]:
    """A recursive look at ``data``: 100 directories of 99 files each (10,000 entries)."""
    listing: dict[str, tuple[int, str]] = {}
    for d in range(100):
        listing[f"data/run-{d:03d}"] = (0, "")
        for f in range(99):
            listing[f"data/run-{d:03d}/part-{f:05d}.parquet"] = (
                1000 + d * f,
                f"2026-11-29T01:{d % 60:02d}:{f % 60:02d}.{d * f:06d}Z",
            )
    assert len(listing) == ENTRIES
    return listing


def retained(build) -> tuple[object, int]:
    """What ``build()`` answers, and the bytes it holds once built (tracemalloc)."""
    tracemalloc.start()
    try:
        start = tracemalloc.get_traced_memory()[0]
        value = build()
        return value, tracemalloc.get_traced_memory()[0] - start
    finally:
        tracemalloc.stop()


def test_a_watcher_keeps_little_of_a_10000_entry_listing():
    listing, listing_bytes = retained(big_listing)  # what a watcher kept before: ~1.9 MB
    snap, snap_bytes = retained(lambda: Snapshot.of(listing))
    assert snap.held_bytes() == 16 * ENTRIES + len(snap.names)
    assert len(snap.paths) == len(snap.states) == ENTRIES
    assert snap_bytes < 256 * 1024, snap_bytes  # 16 bytes an entry and the names
    assert snap_bytes * 8 < listing_bytes, (snap_bytes, listing_bytes)


def test_events_from_a_10000_entry_look_are_envds():
    before = big_listing()
    after = dict(before)
    size, mtime = after["data/run-007/part-00003.parquet"]
    after["data/run-007/part-00003.parquet"] = (size + 1, mtime)  # written: size
    after["data/run-042/part-00010.parquet"] = (size, "2026-11-29T02:00:00.000000Z")  # time
    del after["data/run-099/part-00098.parquet"]  # removed
    after["data/run-050/renamed.parquet"] = after.pop("data/run-050/part-00000.parquet")
    after["data/caf\udce9.csv"] = (3, "2026-11-29T02:00:00.000000Z")  # not UTF-8
    after["data/new-dir"] = (0, "")
    snap = Snapshot.of(before)
    events = [
        (e["type"].removeprefix("EVENT_TYPE_"), e["name"]) for e in changes(snap, after, "data")
    ]
    assert events == [
        ("CREATE", "caf\udce9.csv"),
        ("CREATE", "new-dir"),
        ("CREATE", "run-050/renamed.parquet"),
        ("REMOVE", "run-050/part-00000.parquet"),
        ("REMOVE", "run-099/part-00098.parquet"),
        ("WRITE", "run-007/part-00003.parquet"),
        ("WRITE", "run-042/part-00010.parquet"),
    ]
    # The next look from the new snapshot: the non-UTF-8 name is removed by its own name.
    del after["data/caf\udce9.csv"]
    assert changes(Snapshot.of({**after, "data/caf\udce9.csv": (3, "t")}), after, "data") == [
        {"name": "caf\udce9.csv", "type": "EVENT_TYPE_REMOVE"}
    ]
    assert changes(Snapshot.of(after), after, "data") == []


def test_random_names_past_the_bound_are_refused():
    hostile = {f"d/{secrets.token_urlsafe(180)}": (1, "t") for _ in range(2000)}  # 480 KB
    with pytest.raises(DirectoryTooLarge, match="too large to watch"):
        Snapshot.of(hostile)
    fits = dict(list(hostile.items())[:500])
    assert Snapshot.of(fits).held_bytes() <= MAX_HELD_BYTES


class _Sandbox:
    """What ``watchers.unary`` uses of a sandbox: its listing is ``self.entries``."""

    def __init__(self, services, entries: list[dict]) -> None:
        self.session = SimpleNamespace(session_id="sb-session-x")
        self.cid = "c1"
        self.caller = Caller("alice", "jwt", "acme")
        self.services = services
        self.entries = entries

    async def fs(self, op: str, rel: str, depth: int) -> list[dict]:
        return self.entries


@pytest.fixture
def services():
    quotas = Quotas(e2b_watchers_per_user=64, e2b_watchers_per_tenant=64)
    yield SimpleNamespace(
        settings=SimpleNamespace(quotas=quotas),
        user_limits=UserLimits(quotas, runtime_connections=256),
    )
    for wid in list(watchers._WATCHERS):
        watchers._drop(wid)


def _file(rel: str) -> dict:
    return {"rel": rel, "dir": False, "size": 1, "mtime": "t"}


def test_a_watcher_past_the_bound_answers_the_error_and_keeps_no_slot(services):
    small = [_file("w/a")]
    hostile = [_file(f"w/{secrets.token_urlsafe(180)}") for _ in range(2000)]

    async def main() -> None:
        sandbox = _Sandbox(services, hostile)
        with pytest.raises(DirectoryTooLarge):
            await watchers.unary("CreateWatcher", sandbox, {"path": "w"})
        assert not watchers._WATCHERS  # its slots are back
        sandbox.entries = small
        wid = (await watchers.unary("CreateWatcher", sandbox, {"path": "w"}))["watcherId"]
        sandbox.entries = hostile  # the directory grew past the bound: the error, ...
        with pytest.raises(DirectoryTooLarge):
            await watchers.unary("GetWatcherEvents", sandbox, {"watcherId": wid})
        sandbox.entries = [*small, _file("w/b")]  # ... and the last look kept
        got = await watchers.unary("GetWatcherEvents", sandbox, {"watcherId": wid})
        assert got == {"events": [{"name": "b", "type": "EVENT_TYPE_CREATE"}]}

    asyncio.run(main())
