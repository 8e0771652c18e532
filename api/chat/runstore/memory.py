"""The in-process run store: a run lives in its ``Run`` object and nowhere else.

The embedded default (one API process): events stay SSE frames in the run's own list,
followers are woken in process, nothing is written anywhere — today's speed. A restart
loses open runs; ``aclose`` cancels them, so each stream still ends with ``error`` and
``done`` while the process can write it. Client-side chats' runs are a bounded in-process
index (``chat_index.ChatIndex``; ``ttl`` unused: the bound forgets the oldest).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from ..chat_index import ChatIndex, ChatRun
from . import RunStore

if TYPE_CHECKING:
    from ..run import Run


class MemoryRunStore(RunStore):
    def __init__(self) -> None:
        self.chats = ChatIndex()

    def register(self, run: Run, spec: dict | None) -> None:
        return None  # the registry's own dict is the store

    async def lookup(self, run_id: str) -> Any | None:
        return None

    async def decide(self, run: Any, call_id: str, approved: bool, reason: str) -> None:
        run.decide(call_id, approved, reason)

    async def cancel(
        self, run: Any, code: str = "cancelled", message: str = "the run was cancelled"
    ) -> bool:
        return run.cancel(code, message)

    async def aclose(self, runs: list[Run]) -> None:
        tasks = [r.task for r in runs if r.task and not r.task.done()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def chat_run(self, session_id: str, chat_id: str) -> ChatRun | None:
        return self.chats.get(session_id, chat_id)

    async def set_chat_run(self, session_id: str, chat_id: str, entry: ChatRun, ttl: float) -> None:
        self.chats.set(session_id, chat_id, entry)
