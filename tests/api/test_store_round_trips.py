"""Store mode's hooks make no store round trip they do not need (bench e2b on the node: a
read of the metadata's head is a few ms each, around every command).

``StoreBackend`` over a ``DirStore`` that counts its calls and a real runtime process:
- the first open of a conversation reads its metadata once (the fill and the disabled
  check share it), a later open once (the disabled check: another replica may have
  disabled the workspace); a conversation just created under a new random id (an E2B
  sandbox's) is not read at all, nor at its first open within ``MADE_SECONDS`` (its
  metadata is known to be absent) unless this process disabled it meanwhile;
- a write-back of a conversation whose cache holds no file reads nothing from the store;
  one holding a file still copies and records it, and a disabled workspace is still
  refused.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from datetime import UTC, datetime

import httpx
import pytest

from sandbox_workspace.api.backends import store_backend
from sandbox_workspace.api.backends.base import (
    RuntimeEndpoint,
    Session,
    SessionSpec,
    SessionStatus,
    StoreFence,
)
from sandbox_workspace.api.backends.store_backend import StoreBackend, WorkspaceDisabled
from sandbox_workspace.store.dirstore import DirStore
from sandbox_workspace.store.layout import Layout


class Inner:
    async def conversation_opened(self, session, cid) -> None:
        pass

    conversation_created = conversation_opened

    async def conversation_written(self, session, cid) -> None:
        pass

    @contextlib.asynccontextmanager
    async def store_writing(self, session, cid):
        yield StoreFence()


class CountingStore(DirStore):
    """A ``DirStore`` counting its reads and writes by name."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.calls: Counter[str] = Counter()
        for name in ("read", "get", "head", "put"):
            setattr(self, name, self._counted(name, getattr(self, name)))

    def _counted(self, name: str, method):
        async def call(*args, **kwargs):
            self.calls[name] += 1
            return await method(*args, **kwargs)

        return call

    def taken(self) -> dict[str, int]:
        out = dict(self.calls)
        self.calls.clear()
        return out


@pytest.fixture
async def world(tmp_path, runtime):
    store = CountingStore(tmp_path / "store")
    await store.check()
    http = httpx.AsyncClient(timeout=30)
    backend = StoreBackend(Inner(), http, store, Layout())  # type: ignore[arg-type]
    endpoint = RuntimeEndpoint(runtime.server.url, runtime.token, "1")
    spec = SessionSpec(session_id="sb-session-trips", user_id="trips")
    session = Session(spec, SessionStatus.RUNNING, datetime.now(UTC), str(runtime.root), "",
                      endpoint)  # fmt: skip
    yield backend, store, runtime, session
    await http.aclose()


def _run(runtime, cid: str, code: str) -> None:
    body = {"language": "bash", "code": code}
    r = runtime.client.post(f"/v1/conversations/{cid}/execute", json=body)
    assert r.status_code == 200 and r.json()["exit_code"] == 0, r.text


async def test_hooks_read_the_store_only_when_they_need_it(world) -> None:
    backend, store, runtime, session = world
    cid = "c1"
    await backend.conversation_opened(session, cid)
    assert store.taken() == {"read": 1}  # fill and disabled check: one read of the head
    await backend.conversation_opened(session, cid)
    assert store.taken() == {"read": 1}  # filled: the disabled check alone

    _run(runtime, cid, "echo hi")  # writes nothing the store keeps
    assert await backend.write_back(session, cid) == []
    await backend.conversation_written(session, cid)
    assert store.taken() == {}  # an empty cache: no store round trip at all

    _run(runtime, cid, "mkdir -p outputs && echo 1 > outputs/a.txt")
    recorded = await backend.write_back(session, cid)
    assert [r.file_path for r in recorded] == ["outputs/a.txt"]
    assert store.calls["put"] >= 2  # the file and the metadata
    store.taken()
    assert await backend.write_back(session, cid) == []  # unchanged: read, not copied
    assert store.taken() == {"read": 1}

    await backend.set_enabled(session, cid, False)
    with pytest.raises(WorkspaceDisabled):
        await backend.conversation_opened(session, cid)


async def test_a_conversation_created_under_a_new_id_is_not_read(world, monkeypatch) -> None:
    backend, store, _, session = world
    cid = "e2b-0123456789abcdef0123"
    clock = [1000.0]
    monkeypatch.setattr(store_backend.time, "monotonic", lambda: clock[0])
    await backend.conversation_created(session, cid)
    assert store.taken() == {}
    await backend.conversation_opened(session, cid)  # its first command, a moment later
    assert store.taken() == {}  # made here just now: no metadata to read yet
    clock[0] += store_backend.MADE_SECONDS
    await backend.conversation_opened(session, cid)
    assert store.taken() == {"read": 1}  # later: the disabled check (another replica's)


async def test_a_workspace_this_process_disabled_is_refused_at_once(world) -> None:
    backend, _, _, session = world
    cid = "e2b-00000000000000000000"
    await backend.conversation_created(session, cid)
    await backend.set_enabled(session, cid, False)
    with pytest.raises(WorkspaceDisabled):  # not taken as freshly made any more
        await backend.conversation_opened(session, cid)
