"""One pipelined connection whose replies are handled the moment they arrive.

Contract:
- ``Pipe.open(redis, on_reply)`` connects like any connection of ``redis``'s pool
  (address, TLS, AUTH, SELECT: redis-py's own handshake), then takes the connection's
  transport over. ``send(packed, token)`` writes a command at once (no await, no task);
  each reply is handed to ``on_reply(token, reply)`` in the order the commands were sent,
  from the transport's own data callback. Error replies arrive as ``ResponseError``
  values (never raised); ``on_reply`` must not raise (what it raises is logged).
- ``closed`` resolves once the connection is gone (``close``, or the server or network);
  ``unanswered()`` then names, in order, the tokens of commands sent without a reply —
  they may or may not have been executed.

Why not redis-py's own reading: a reply read by a task reaches its caller one turn of the
event loop after it arrived (the stream reader wakes the task, the task runs next turn),
and the writer's flush task cost another turn before the command even left. With 200
runs streaming, a turn of the API's loop is about a millisecond (bench/chat.py): those
turns were most of what the Redis store added per event. Here: the flush is a
``call_soon`` callback, the reply wakes the followers from ``data_received`` — the
followers write in the next turn, as they do with the in-process store.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from typing import Any

import hiredis
from redis.asyncio import Redis
from redis.exceptions import ResponseError

log = logging.getLogger(__name__)


class Pipe(asyncio.Protocol):
    def __init__(self, redis: Redis, conn: Any, on_reply: Callable[[Any, Any], None]) -> None:
        self._redis, self._conn, self._on_reply = redis, conn, on_reply
        self._reader = hiredis.Reader(replyError=ResponseError)
        self._waiting: deque = deque()
        self.closed: asyncio.Future = asyncio.get_running_loop().create_future()
        # redis-py connected and authenticated over asyncio streams; from now on the
        # transport reports to this protocol, and redis-py never reads it again.
        self._transport = conn._writer.transport
        self._transport.set_protocol(self)

    @classmethod
    async def open(cls, redis: Redis, on_reply: Callable[[Any, Any], None]) -> Pipe:
        conn = await redis.connection_pool.get_connection()
        try:
            return cls(redis, conn, on_reply)
        except BaseException:
            await conn.disconnect(nowait=True)
            await redis.connection_pool.release(conn)
            raise

    def send(self, packed: bytes, token: Any) -> None:
        if self.closed.done() or self._transport.is_closing():
            raise ConnectionError("the run store connection is closed")
        self._transport.write(packed)
        self._waiting.append(token)

    def unanswered(self) -> list:
        return list(self._waiting)

    def __len__(self) -> int:  # commands awaiting their reply
        return len(self._waiting)

    def data_received(self, data: bytes) -> None:
        self._reader.feed(data)
        while (reply := self._reader.gets()) is not False:
            token = self._waiting.popleft()
            try:
                self._on_reply(token, reply)
            except Exception:  # the connection must go on for the other runs
                log.exception("run store reply handling failed")

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(exc)

    async def close(self) -> None:
        """Close the connection and give it back to redis-py's pool (as disconnected)."""
        self._transport.close()
        # nowait: the streams' own protocol no longer hears of the close.
        await self._conn.disconnect(nowait=True)
        await self._redis.connection_pool.release(self._conn)
