"""What a run reaches outside the model and its tools: ``RunConversation``.

Contract: the engine (``loop.run_agent``) calls these, and nothing else of the API's
services, so it can be driven by the real service (``chat/service.ServiceConversation``)
or a test's fake alike:
- ``ensure_session`` — the caller's session running and the conversation opened in it
  (kubernetes: its ConversationWorkspace, finalizer included, exists) before anything
  of the run is written; returns the session;
- ``before_tool`` — raises when the conversation may no longer be written (a deletion
  accepted by another replica reaches the run this way);
- ``after_write`` — after each tool call and after the run's marks: the conversation
  may have changed (store mode writes it back; kubernetes re-checks a racing deletion);
- ``record_activity`` — an open run and a pending approval count as session activity;
- ``table_writer`` — /agents with ``table_id``: PUTs the merged table to the table
  source; None otherwise (and for a run resumed elsewhere whose caller's credential was
  never stored).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from ..backends.base import Session


class RunConversation(Protocol):
    """The session, files and activity of the conversation a run works in."""

    table_writer: Callable[[Any], Awaitable[None]] | None

    async def ensure_session(self) -> Session: ...

    async def before_tool(self) -> None: ...

    async def after_write(self) -> None: ...

    async def record_activity(self) -> None: ...
