"""Which run a client-side chat is on: the AI SDK names chats by its own ``id``, and
``GET /ui/chat/{id}/stream`` must find that chat's active run — on whichever replica the
request lands, so the index lives in the run store (``RunStore.chat_run`` /
``set_chat_run``; the Redis store keeps it in Redis). This module holds the entry and the
in-process index the in-process store uses.

Contract: ``ChatIndex.set(session_id, chat_id, entry)`` records the chat's current run and
the id of the assistant message streaming it (``ChatRun``); ``get`` returns it only to the
same session — tenant and user (a chat id is the client's choice, so it is scoped by the
caller's session, never global, and a user id repeated in another tenant is another).
Bounded: past ``limit`` chats the least recently set are forgotten — they can only lose
the ability to resume a stream, never reach another user's run (runs are checked by
owner).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass


@dataclass(frozen=True)
class ChatRun:
    run_id: str
    message_id: str


class ChatIndex:
    def __init__(self, limit: int = 10_000) -> None:
        self.limit = limit
        self._chats: OrderedDict[tuple[str, str], ChatRun] = OrderedDict()

    def set(self, session_id: str, chat_id: str, entry: ChatRun) -> None:
        key = (session_id, chat_id)
        self._chats.pop(key, None)
        self._chats[key] = entry
        while len(self._chats) > self.limit:
            self._chats.popitem(last=False)

    def get(self, session_id: str, chat_id: str) -> ChatRun | None:
        return self._chats.get((session_id, chat_id))
