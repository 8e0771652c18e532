"""api/backends/store_errors.py: the store's own errors (no HTTP in them) become the API's
answers at one edge — the statuses, codes, messages and Retry-After store mode has always
answered — on every path a store call takes: a coroutine, a listing, a download's bytes,
and the metadata above the store (whose own retries still see the store's errors)."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from fastapi import FastAPI

from sandbox_workspace.api.backends.store_errors import StoreFailure, translated
from sandbox_workspace.contract.errors import ApiError, install_error_handlers
from sandbox_workspace.store import (
    DirStore,
    ObjectNotFound,
    PreconditionFailed,
    StoreConfigError,
    StoreError,
    StoreUnavailable,
)
from sandbox_workspace.store.layout import Layout, Scope
from sandbox_workspace.store.metadata import Metadata

ANSWERED = [  # (raised, status, code, Retry-After)
    (ObjectNotFound("no object 'k'"), 404, "not_found", None),
    (PreconditionFailed("object 'k' changed meanwhile"), 409, "precondition_failed", None),
    (StoreUnavailable("object store error: boom"), 503, "store_unavailable", "2"),
    (StoreConfigError("set SANDBOX_WORKSPACE_S3__BUCKET"), 503, "store_misconfigured", "5"),
    (StoreError("odd"), 503, "store_error", "5"),
]


def test_store_errors_know_nothing_of_http():
    for error, *_ in ANSWERED:
        assert not isinstance(error, ApiError)
        assert not hasattr(error, "status")


class Failing:
    """A store whose every call fails with ``error``."""

    def __init__(self, error: StoreError) -> None:
        self.error = error

    async def put(self, key, body, **_):
        raise self.error

    async def read(self, key):
        raise self.error

    async def list(self, prefix):
        raise self.error
        yield  # an async generator, as the stores' listings are

    async def get(self, key):
        return BrokenDownload(self.error)


class BrokenDownload:
    info = object()

    def __init__(self, error: StoreError) -> None:
        self.error = error

    async def __aiter__(self):
        yield b"first"
        raise self.error

    async def aclose(self) -> None:
        pass


@pytest.mark.parametrize(("error", "status", "code", "retry_after"), ANSWERED)
async def test_each_store_error_is_answered_as_before(error, status, code, retry_after):
    store = translated(Failing(error))
    app = FastAPI()
    install_error_handlers(app, default_retry_after=5)

    @app.get("/put")
    async def put():
        await store.put("k", b"x")

    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        r = await client.get("/put")
    assert r.status_code == status
    assert r.json() == {"error": {"code": code, "message": str(error)}}
    assert r.headers.get("retry-after") == retry_after


@pytest.mark.parametrize("error", [e for e, *_ in ANSWERED], ids=lambda e: type(e).__name__)
async def test_listings_and_downloads_fail_as_api_errors_too(error):
    store = translated(Failing(error))
    with pytest.raises(StoreFailure) as raised:
        async for _ in store.list("p/"):
            pass
    assert raised.value.__cause__ is error
    download = await store.get("k")
    chunks = []
    with pytest.raises(StoreFailure):
        async for chunk in download:
            chunks.append(chunk)
    assert chunks == [b"first"]
    await download.aclose()


async def test_metadata_retries_on_the_stores_own_errors_and_answers_api_errors(tmp_path):
    store = DirStore(tmp_path)
    await translated(store).check()
    meta = translated(Metadata(store, Layout()))
    scope = Scope("default", "sb-session-u")
    manifest, _ = await meta.update(scope, "c1", lambda m: None)  # a put if_absent inside
    assert manifest.conversation_id == "c1"
    # Concurrent changes lose compare-and-swaps (PreconditionFailed) and retry inside.
    flips = [meta.set_enabled(scope, "c1", i % 2 == 0) for i in range(8)]
    assert len(await asyncio.gather(*flips)) == 8
    assert (await meta.get(scope, "c1")).conversation_id == "c1"
    raw = translated(store)
    with pytest.raises(StoreFailure) as raised:
        await raw.read("no/such/key")
    assert (raised.value.status, raised.value.code) == (404, "not_found")


async def test_the_api_backends_hold_the_store_and_its_metadata_only_translated():
    from sandbox_workspace.api.backends.cache_records import RecordsBackend
    from sandbox_workspace.api.backends.store_backend import StoreBackend

    failing = Failing(StoreUnavailable("down"))
    for backend in (
        StoreBackend(None, None, failing, Layout()),
        RecordsBackend(None, None, failing),
    ):
        with pytest.raises(StoreFailure):
            await backend.store.put("k", b"x")
        with pytest.raises(StoreFailure) as raised:
            await backend.meta.get(Scope("default", "sb-session-u"), "c1")
        assert raised.value.code == "store_unavailable"
