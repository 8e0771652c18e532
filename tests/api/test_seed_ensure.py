"""Seed 000 §3.2's own client (``seed_client.SeedClient``, its Go ported literally) works
unchanged: a new user, a running session, a stopped one, one in error, and three first
uses at once. After the client's POST an existing session that is down answers 409 as
the seed expects, but its resume has started: the very next GET says ``pending`` (never
``stopped``), then ``running``, with the files kept.

Runs against the local backend here and against the kubernetes backend in the cluster
tier (``tests/cluster/test_seed_ensure_kubernetes.py`` adds the idle stop there). Here a
session is stopped by restarting its API; the local backend's idle stop, with the same
client, is ``test_local_idle_stop.py``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from seed_client import SeedClient, assert_recovered


def _sid(user: str) -> str:
    return f"sb-session-{user}"


def _upload(client: httpx.Client, user: str, name: str, data: bytes) -> None:
    r = client.post(
        f"/api/v1/sessions/{_sid(user)}/files/upload",
        files={"file": (name, data)},
        data={"conversation_id": "c"},
    )
    assert r.status_code == 201, r.text


def _names(client: httpx.Client, user: str) -> list[str]:
    r = client.get(f"/api/v1/sessions/{_sid(user)}/files", params={"conversation_id": "c"})
    assert r.status_code == 200, r.text
    return r.json()["files"]  # seed 000 §6.3: the names


def test_new_user_is_created_and_waited_for(api, user):
    seed = SeedClient(api, user)
    assert seed.ensure(_sid(user)) == _sid(user)
    assert seed.actions == ["create_new"] and seed.created == [201]
    assert seed.seen[-1] == "running"
    body = api.get(f"/api/v1/sessions/{_sid(user)}").json()
    assert (body["agent_id"], body["business_domain_id"]) == ("agent-seed", "bd-seed")


def test_running_session_is_reused_without_a_create(api, user, session_url, wait_status):
    assert api.post("/api/v1/sessions", json={}).status_code == 201
    wait_status(api, session_url, "running")
    seed = SeedClient(api, user)
    assert seed.ensure(_sid(user)) == _sid(user)
    assert seed.actions == ["reuse_existing"] and seed.created == [] and seed.seen == ["running"]


@pytest.mark.local_backend
def test_session_in_error_is_recovered_with_its_files(
    api, user, session_url, runtime_pids, wait_status
):
    _upload(api, user, "keep.csv", b"1,2")
    session_dir = Path(api.get(session_url).json()["workspace_path"]).parent
    [pid] = runtime_pids(session_dir)
    os.kill(pid, signal.SIGKILL)
    wait_status(api, session_url, "error")
    seed = SeedClient(api, user)
    assert seed.ensure(_sid(user)) == _sid(user)
    assert_recovered(seed, "error")
    assert _names(api, user) == ["keep.csv"]


@contextlib.contextmanager
def _stopped(start_server, user: str, before) -> Iterator[str]:
    """A server where ``user``'s session is stopped (its API was restarted after
    ``before(client)`` ran on the first one); its URL. Stopped when done (the factory
    would keep it, and its runtime, until the end of the test session)."""
    first = start_server("dev", "--data-dir", "data", SANDBOX_WORKSPACE_SANDBOX_MOUNT="none")
    with httpx.Client(base_url=first.url, headers={"X-User-Id": user}, timeout=30) as client:
        before(client)
    first.stop()
    data = str(first.workdir / "data")
    second = start_server("dev", "--data-dir", data, SANDBOX_WORKSPACE_SANDBOX_MOUNT="none")
    try:
        yield second.url
    finally:
        second.stop()


@pytest.mark.local_backend
def test_stopped_session_is_recovered_with_its_files(start_server):
    user = "seed-stopped"
    with (
        _stopped(start_server, user, lambda c: _upload(c, user, "keep.csv", b"kept")) as url,
        httpx.Client(base_url=url, headers={"X-User-Id": user}, timeout=30) as client,
    ):
        seed = SeedClient(client, user)
        assert seed.ensure(_sid(user)) == _sid(user)
        assert_recovered(seed, "stopped")
        assert _names(client, user) == ["keep.csv"]


@pytest.mark.local_backend
def test_create_of_a_stopped_session_is_409_and_the_next_get_is_pending(start_server):
    """The contract the seed's client rests on, step by step (seed 000 §8.1)."""
    user = "seed-next-get"
    session = f"/api/v1/sessions/{_sid(user)}"
    with (
        _stopped(start_server, user, lambda c: c.post("/api/v1/sessions", json={})) as url,
        httpx.Client(base_url=url, headers={"X-User-Id": user}, timeout=30) as client,
    ):
        assert client.get(session).json()["status"] == "stopped"
        r = client.post("/api/v1/sessions", json={})
        assert r.status_code == 409 and r.json()["error"]["code"] == "session_exists"
        assert client.get(session).json()["status"] in ("pending", "running")


def test_three_first_uses_at_once_all_succeed(dev_server, user):
    """All three GET 404 and then POST together: one 201, two 409s that wait for it."""
    line = threading.Barrier(3, timeout=30)

    def first_use() -> SeedClient:
        with httpx.Client(
            base_url=dev_server.url, headers={"X-User-Id": user}, timeout=30
        ) as client:
            seed = SeedClient(client, user, before_create=line.wait)
            assert seed.ensure(_sid(user)) == _sid(user)
            return seed

    with ThreadPoolExecutor(3) as pool:
        seeds = [f.result() for f in [pool.submit(first_use) for _ in range(3)]]
    assert all(s.actions == ["create_new"] for s in seeds)
    assert sorted(code for s in seeds for code in s.created) == [201, 409, 409]
    assert all(s.seen[-1] == "running" and "stopped" not in s.seen for s in seeds)
