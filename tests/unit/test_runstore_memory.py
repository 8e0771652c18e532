"""The in-process run store behind the same interface: nothing leaves the process."""

from __future__ import annotations

import asyncio

import pytest

from sandbox_workspace.api.chat.runs import Run, RunRegistry
from sandbox_workspace.api.chat.runstore.factory import build_store
from sandbox_workspace.api.chat.runstore.memory import MemoryRunStore
from sandbox_workspace.api.settings import ApiSettings
from sandbox_workspace.contract.errors import Conflict, NotFoundError


def test_memory_is_the_default_store_and_redis_needs_a_url():
    assert isinstance(build_store(ApiSettings(auth_mode="dev")), MemoryRunStore)
    with pytest.raises(ValueError, match="CHAT_REDIS_URL"):
        ApiSettings(auth_mode="dev", chat_run_store="redis")


async def test_runs_are_found_decided_and_cancelled_in_process_only():
    registry = RunRegistry(60)
    run = registry.add(Run(user_id="u", session_id="s", conversation_id="c"), {"query": "q"})
    assert run.sink is None and run.durable is None  # emit wakes followers directly
    assert await registry.find(run.id, "s") is run
    with pytest.raises(NotFoundError):
        await registry.find("run_elsewhere", "s")
    run.open_approval("call_1", "bash")
    await registry.decide(run, "call_1", True)
    with pytest.raises(Conflict):
        await registry.decide(run, "call_1", True)
    run.task = asyncio.create_task(asyncio.sleep(60))
    assert await registry.cancel(run) is True
    await asyncio.gather(run.task, return_exceptions=True)
    assert run.task.cancelled()


async def test_closing_stops_the_runs_of_this_process():
    registry = RunRegistry(60)
    run = registry.add(Run(user_id="u", session_id="s", conversation_id="c"))
    run.task = asyncio.create_task(asyncio.sleep(60))
    await registry.aclose()
    assert run.task.cancelled()
