"""The JWKS keys JWTs are verified with, fetched on a schedule callers cannot drive.

Contract:
- ``JwksKeys.key(kid)`` answers a key it holds at once, with no I/O.
- A ``kid`` it does not hold refreshes the whole set only when the last refresh (or
  failed attempt) is at least ``min_refresh_seconds`` old — an IdP rotating its keys is
  picked up within that time. Otherwise, and when the refreshed set still lacks it, the
  kid is remembered as unknown for ``min_refresh_seconds`` (bounded) and refused at once.
  So tokens with made-up kids cost at most one IdP fetch per interval, never one per
  request, and never tie up a worker thread each (security review M1).
- One fetch at a time (an asyncio lock); it runs in a worker thread (PyJWT's urllib
  client) with a short timeout, so the event loop never waits on the IdP. A failed fetch
  keeps the keys held and answers 401 for the unknown kid, saying why.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import OrderedDict
from collections.abc import Callable

import jwt

from sandbox_workspace.contract.errors import Unauthorized

log = logging.getLogger(__name__)

_UNKNOWN_LIMIT = 10_000


class JwksKeys:
    def __init__(
        self,
        url: str,
        *,
        min_refresh_seconds: float = 30.0,
        timeout: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.url = url
        self.min_refresh = min_refresh_seconds
        self.clock = clock
        self._client = jwt.PyJWKClient(url, cache_jwk_set=False, timeout=timeout)
        self._keys: dict[str | None, jwt.PyJWK] = {}
        self._unknown: OrderedDict[str | None, float] = OrderedDict()  # kid → refused until
        self._refreshed_at = -math.inf
        self._lock = asyncio.Lock()
        self.fetches = 0  # attempts, for tests and logs

    async def key(self, kid: str | None) -> jwt.PyJWK:
        if kid in self._keys:
            return self._keys[kid]
        if self._unknown.get(kid, -math.inf) > self.clock():
            raise _unknown(kid)
        async with self._lock:
            if kid not in self._keys and self.clock() - self._refreshed_at >= self.min_refresh:
                await self._refresh()
            if kid in self._keys:
                return self._keys[kid]
            self._unknown.pop(kid, None)
            self._unknown[kid] = self.clock() + self.min_refresh
            while len(self._unknown) > _UNKNOWN_LIMIT:
                self._unknown.popitem(last=False)
        raise _unknown(kid)

    async def _refresh(self) -> None:
        self._refreshed_at = self.clock()  # failures count too: an IdP down is not hammered
        self.fetches += 1
        try:
            keys = await asyncio.to_thread(self._client.get_jwk_set, True)
        except jwt.PyJWTError as e:  # unreachable, not JSON, no usable key
            log.warning("JWKS %s could not be fetched: %s", self.url, e)
            return
        self._keys = {k.key_id: k for k in keys.keys}
        self._unknown.clear()  # a new set: every kid may be judged anew


def _unknown(kid: str | None) -> Unauthorized:
    return Unauthorized(f"invalid JWT: no key with kid {kid!r} in the JWKS")
