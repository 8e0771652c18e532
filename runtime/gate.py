"""The deletion gate: which conversations are being deleted right now.

Contract: while ``deleting(cid)`` is held (nestable, thread-safe), ``refuse(cid)`` raises
``ConversationDeleting`` (409 ``conversation_deleting``, ``Retry-After: 1``). Every write
path — creating the layout, committing an upload, spawning code — calls it synchronously
right before it acts, so nothing that starts after the gate is set can write into what is
being deleted.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Hashable, Iterator

from sandbox_workspace.contract.errors import ConversationDeleting


class DeletionGate:
    """Keys being deleted (a conversation id here; the API's local backend keys by
    session and conversation), counted so that overlapping deletions nest."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._deleting: dict[Hashable, int] = {}

    @contextlib.contextmanager
    def deleting(self, cid: Hashable) -> Iterator[Hashable]:
        with self._lock:
            self._deleting[cid] = self._deleting.get(cid, 0) + 1
        try:
            yield cid
        finally:
            with self._lock:
                if self._deleting[cid] == 1:
                    del self._deleting[cid]
                else:
                    self._deleting[cid] -= 1

    def is_deleting(self, cid: Hashable) -> bool:
        with self._lock:
            return cid in self._deleting

    def refuse(self, cid: str) -> None:
        if self.is_deleting(cid):
            raise ConversationDeleting(cid)
