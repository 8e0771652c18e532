"""Where chat runs live: the interface every run store implements.

Contract (``RunStore``):
- ``register(run, spec)``: a run started in this process; the store owns whatever must
  outlive the process (a replicated store: the event log, metadata, a lease). ``spec`` is
  the run's JSON-able request, enough for another replica to resume it.
- ``lookup(run_id)``: a run this process does not hold, as a view that follows, decides
  and cancels through the store — or ``None`` (the in-process store never has one).
- ``conversation_runs(session_id, conversation_id)``: views of a conversation's runs the
  store holds (the in-process store: none beyond the registry's own).
- ``decide`` / ``cancel``: for any run, local or not (``cancel`` with the code and message
  its ``error`` event carries); a second decision is 409, an unknown
  tool call 404, exactly as ``Run.decide`` answers in process.
- ``start(resume)``: begin background work; ``resume(run, spec, checkpoint)`` starts the
  ReAct loop of a run this process has taken over (``checkpoint`` None: from the start).
- ``aclose(runs)``: at shutdown; the in-process store stops the runs, a replicated one
  hands them over to the other replicas.

What the protocol routes (/ui/chat, /ag-ui, a conversation's run list) read, for a run
this process holds (a ``Run``) or one ``lookup`` returned — same answers on every replica:
- ``frames(run)``: the events stored so far, as SSE frames (event N at index N - 1),
  without waiting for more; ``open_approvals(run)``: the tool calls it waits on now (asked,
  neither decided nor timed out); ``last_event_ids(runs)``: each run's last event id.
- ``chat_run(session_id, chat_id)`` / ``set_chat_run(session_id, chat_id, entry, ttl)``:
  which run (and assistant message) a client-side chat is on (``chat_index.ChatRun``),
  scoped by the caller's session (tenant and user); ``set`` replaces the entry, which
  may be forgotten after ``ttl`` seconds (or earlier, bounded memory) — that only loses
  the chance to resume, never shows a run to another session (runs are checked by owner).

Two implementations: ``memory.MemoryRunStore`` (the embedded default: nothing leaves the
process, no added latency) and ``redis_store.RedisRunStore`` (Valkey / Redis >= 7 streams;
several API replicas, runs survive a restart). ``factory.build_store(settings)`` picks one
(the package itself imports neither, so each can import the interface from here).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..chat_index import ChatRun
    from ..run import Run

Resume = Callable[["Run", dict, "dict | None"], Any]


class RunStore(ABC):
    replicated: bool = False

    @property
    def reachable(self) -> bool:
        """Whether the store answered recently enough to serve (``/readyz``)."""
        return True

    async def before_tool(self, run_id: str) -> None:
        """Called before each tool call of run ``run_id`` starts: a replicated store waits
        while it cannot be sure this replica holds the run's lease (no tool runs twice)."""
        return None

    @abstractmethod
    def register(self, run: Run, spec: dict | None) -> None: ...

    @abstractmethod
    async def lookup(self, run_id: str) -> Any | None: ...

    async def conversation_runs(self, session_id: str, conversation_id: str) -> list[Any]:
        return []

    @abstractmethod
    async def decide(self, run: Any, call_id: str, approved: bool, reason: str) -> None: ...

    @abstractmethod
    async def cancel(
        self, run: Any, code: str = "cancelled", message: str = "the run was cancelled"
    ) -> bool: ...

    async def start(self, resume: Resume) -> None:
        return None

    @abstractmethod
    async def aclose(self, runs: list[Run]) -> None: ...

    # What every store answers the same way for a run held in this process; a replicated
    # store answers for its views (``lookup``) from the store.
    async def frames(self, run: Any) -> list[bytes]:
        return run.frames[: run.visible]

    async def open_approvals(self, run: Any) -> set[str]:
        return run.open_calls()

    async def last_event_ids(self, runs: list[Any]) -> list[int]:
        return [run.visible for run in runs]

    @abstractmethod
    async def chat_run(self, session_id: str, chat_id: str) -> ChatRun | None: ...

    @abstractmethod
    async def set_chat_run(
        self, session_id: str, chat_id: str, entry: ChatRun, ttl: float
    ) -> None: ...
