"""The runtime's background processes (runtime/processes.py) against a real runtime
process on 127.0.0.1: the bound on how many run at once holds under concurrent starts."""

from __future__ import annotations

import asyncio

import httpx
import pytest


@pytest.mark.parametrize("runtime_env", [{"SANDBOX_RUNTIME_MAX_BACKGROUND_PROCESSES": "2"}])
def test_concurrent_starts_never_run_more_processes_than_the_bound(runtime):
    # All sent at once: each start waits for the spawner, and a check of the running
    # processes alone let every one of them through.
    async def start(client: httpx.AsyncClient) -> int:
        body = {"code": "sleep 60", "timeout": 60}
        async with client.stream("POST", "/v1/conversations/c/processes", json=body) as r:
            return r.status_code

    async def main() -> list[int]:
        headers = {"Authorization": f"Bearer {runtime.token}"}
        async with httpx.AsyncClient(
            base_url=runtime.server.url, headers=headers, timeout=30
        ) as client:
            return await asyncio.gather(*(start(client) for _ in range(8)))

    runtime.client.put("/v1/conversations/c").raise_for_status()
    statuses = asyncio.run(main())
    assert sorted(statuses) == [200, 200] + [429] * 6, statuses
    listed = runtime.client.get("/v1/conversations/c/processes").json()["processes"]
    assert sum(p["running"] for p in listed) == 2


def test_a_process_started_under_another_spelling_of_the_id_is_the_conversations(runtime):
    # "é" decomposed names the same conversation as "é" composed (ids are NFC): a start
    # under either spelling is listed, counted and killed with that one conversation.
    composed, decomposed = "caf\u00e9", "cafe\u0301"
    runtime.client.put(f"/v1/conversations/{composed}").raise_for_status()
    body = {"code": "sleep 60", "timeout": 60}
    with runtime.client.stream("POST", f"/v1/conversations/{decomposed}/processes", json=body) as r:
        assert r.status_code == 200
    listed = runtime.client.get(f"/v1/conversations/{composed}/processes").json()["processes"]
    assert [p["running"] for p in listed] == [True]
