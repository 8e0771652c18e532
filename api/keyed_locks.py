"""One asyncio lock per key, kept only while in use.

Contract: ``KeyedLocks().hold(key)`` is an async context manager that serialises holders
of equal keys; a key's lock is dropped when its last holder (or waiter) leaves, so the
map holds only keys in use — never one entry per conversation ever seen by the process
(a map that only grew was a slow leak a user could speed up with random ids).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Hashable


class KeyedLocks:
    def __init__(self) -> None:
        self._locks: dict[Hashable, tuple[asyncio.Lock, int]] = {}

    def __len__(self) -> int:
        return len(self._locks)

    @contextlib.asynccontextmanager
    async def hold(self, key: Hashable) -> AsyncIterator[None]:
        lock, users = self._locks.get(key) or (asyncio.Lock(), 0)
        self._locks[key] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[key]
            if users == 1:
                del self._locks[key]
            else:
                self._locks[key] = (lock, users - 1)
