"""The API's edge with the object store: a store error becomes an API error here, once.

The store (``sandbox_workspace/store``) raises its own errors, which know nothing of HTTP.
The API's store backends hold the store and its metadata only through ``translated``, so
inside the API every failure is an ``ApiError`` (as ``RuntimeClient`` makes the
runtime's): a route, a chat run, a tool call, an E2B or seed 002 answer renders it like
any other. What each answers (``ANSWERS``; the first match along the error's classes):

| store error          | status | code                  | Retry-After          |
|----------------------|--------|-----------------------|----------------------|
| `ObjectNotFound`     | 404    | `not_found`           | —                    |
| `PreconditionFailed` | 409    | `precondition_failed` | —                    |
| `StoreUnavailable`   | 503    | `store_unavailable`   | 2                    |
| `StoreConfigError`   | 503    | `store_misconfigured` | the API's default    |
| `StoreError`         | 503    | `store_error`         | the API's default    |

The message is the store's own. A proxy translates every coroutine method's error, an
async iterator's (``list``) and a download's bytes (``get``'s answer).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import AsyncIterator, Iterator
from typing import Any, TypeVar, cast

from sandbox_workspace.contract.errors import ApiError
from sandbox_workspace.store import (
    ObjectNotFound,
    PreconditionFailed,
    StoreConfigError,
    StoreError,
    StoreUnavailable,
)

T = TypeVar("T")

ANSWERS: dict[type[StoreError], tuple[int, str, int | None]] = {
    ObjectNotFound: (404, "not_found", None),
    PreconditionFailed: (409, "precondition_failed", None),
    StoreUnavailable: (503, "store_unavailable", 2),
    StoreConfigError: (503, "store_misconfigured", None),
    StoreError: (503, "store_error", None),
}


class StoreFailure(ApiError):
    """A store error as the API answers it (``api_error``)."""


def api_error(e: StoreError) -> StoreFailure:
    kind = next(k for k in type(e).__mro__ if k in ANSWERS)
    status, code, retry_after = ANSWERS[kind]
    failure = StoreFailure(str(e), code=code)
    failure.status, failure.retry_after = status, retry_after
    return failure


@contextlib.contextmanager
def _translating() -> Iterator[None]:
    try:
        yield
    except StoreError as e:
        raise api_error(e) from e


async def _each(items: AsyncIterator[Any]) -> AsyncIterator[Any]:
    with _translating():
        async for item in items:
            yield item


class _Download:
    """A download whose bytes fail as API errors."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.info = inner.info

    def __aiter__(self) -> AsyncIterator[bytes]:
        return _each(aiter(self._inner))

    async def aclose(self) -> None:
        with _translating():
            await self._inner.aclose()


class _Translated:
    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        if inspect.iscoroutinefunction(attr):

            @functools.wraps(attr)
            async def call(*args: Any, **kwargs: Any) -> Any:
                with _translating():
                    result = await attr(*args, **kwargs)
                has_bytes = hasattr(result, "__aiter__") and hasattr(result, "info")
                return _Download(result) if has_bytes else result

            return call
        if inspect.isasyncgenfunction(attr):
            return functools.wraps(attr)(lambda *a, **kw: _each(attr(*a, **kw)))
        return attr


def translated(inner: T) -> T:
    """``inner`` (an ``ObjectStore``, a ``Metadata``) as the API uses it: the same
    methods, failing with ``StoreFailure`` instead of the store's errors."""
    return cast(T, _Translated(inner))
