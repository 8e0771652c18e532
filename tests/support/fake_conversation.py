"""A ``RunConversation`` (api/chat/conversation.py) for driving the engine in a test:
each call does what the test hands in, and nothing by default."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any


async def _nothing() -> None:
    return None


class FakeConversation:
    def __init__(
        self,
        *,
        ensure_session: Callable[[], Awaitable[Any]] | None = None,
        record_activity: Callable[[], Awaitable[None]] = _nothing,
        before_tool: Callable[[], Awaitable[None]] = _nothing,
        after_write: Callable[[], Awaitable[None]] = _nothing,
        table_writer: Callable[[Any], Awaitable[None]] | None = None,
    ) -> None:
        self._ensure, self._record = ensure_session, record_activity
        self._before, self._after = before_tool, after_write
        self.table_writer = table_writer

    async def ensure_session(self) -> Any:
        if self._ensure is None:
            raise AssertionError("this test's run does not ensure a session")
        return await self._ensure()

    async def before_tool(self) -> None:
        await self._before()

    async def after_write(self) -> None:
        await self._after()

    async def record_activity(self) -> None:
        await self._record()
