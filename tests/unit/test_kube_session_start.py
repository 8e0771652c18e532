"""A new user's session start on the kubernetes backend in the fewest apiserver round
trips (api/backends/kubernetes.py, api/sessions.py; issue 39 item 6): the two names a
session may have are asked at once, the create's answer is not read again, the wait
watches from the create's version and takes the session from the watch event (no read
after it) — and an event's object that is not the session's own is never taken.
With the fake apiserver (tests/support/fake_kube.py) and a watch served on MockTransport."""

from __future__ import annotations

import asyncio
import base64
import json

import httpx
import pytest

from sandbox_workspace.api.backends.base import SessionStatus
from sandbox_workspace.api.backends.kubernetes import KubernetesBackend
from sandbox_workspace.api.identity import Caller
from sandbox_workspace.api.sessions import SessionService
from sandbox_workspace.contract import crd
from sandbox_workspace.kube import core_path, custom_path
from sandbox_workspace.operator import naming
from sandbox_workspace.operator.models import FileUploadConfig
from tests.support.fake_kube import FakeKube

NS = "sessions"
USER = "e2b-bench-1234abcd"  # a hashed name: a current and a legacy one


class Credentials:
    def bearer(self) -> str:
        return "t"


class WatchedKube(FakeKube):
    """FakeKube with a watch: each watch request (its params kept in ``watches``) answers
    the one event ``on_watch()`` makes from the objects as they are then; its ``get``
    counts how many reads are in flight at once (``most_at_once``)."""

    def __init__(self, on_watch) -> None:
        super().__init__()
        self.watches: list[dict[str, str]] = []
        self.in_flight = self.most_at_once = 0

        def answer(request: httpx.Request) -> httpx.Response:
            self.watches.append(dict(request.url.params))
            return httpx.Response(200, content=json.dumps(on_watch(self)).encode() + b"\n")

        self.http = httpx.AsyncClient(base_url="http://kube", transport=httpx.MockTransport(answer))
        self.credentials = Credentials()

    async def get(self, path: str):
        self.in_flight += 1
        self.most_at_once = max(self.most_at_once, self.in_flight)
        await asyncio.sleep(0.01)  # a round trip: a second read may start meanwhile
        self.in_flight -= 1
        return await super().get(path)


def session_path(sid: str) -> str:
    return custom_path(NS, crd.SESSION_PLURAL, naming.session_name(sid))


def running(kube: FakeKube, sid: str, *, user: str = USER, path: str | None = None) -> dict:
    """The operator's status write: the CR Running on a pod, its token Secret made;
    ``path``: the ``workspacePath`` it records (the claim's answer)."""
    obj = kube.objects[session_path(sid)]
    obj["spec"]["userId"] = user
    obj["status"] = {
        "phase": "Running",
        "endpoint": "http://10.0.0.9:8080",
        "podName": "pool-1",
        "startedAt": "2026-11-28T00:00:00Z",
        **({"workspacePath": path} if path else {}),
    }
    secret = naming.runtime_secret_name(obj["metadata"]["name"])
    token = base64.b64encode(b"tok").decode()
    kube.put(core_path(NS, "secrets", secret), {"data": {"token": token}})
    kube._bump(obj)
    return {"type": "MODIFIED", "object": obj}


def start(
    kube: WatchedKube, runtime=lambda r: httpx.Response(503)
) -> tuple[SessionService, Caller]:
    http = httpx.AsyncClient(transport=httpx.MockTransport(runtime))
    backend = KubernetesBackend(kube, NS, http)  # type: ignore[arg-type]
    service = SessionService(backend, default_upload=FileUploadConfig(), ready_timeout=5)
    return service, Caller(user_id=USER, via="dev")


def test_a_new_users_session_starts_without_reading_what_it_was_told() -> None:
    caller = Caller(user_id=USER, via="dev")
    sid = caller.session_id
    kube = WatchedKube(lambda k: running(k, sid))
    service, caller = start(kube)
    session = asyncio.run(service.ensure_running(caller, sid))
    assert session.status == SessionStatus.RUNNING and session.endpoint.token == "tok"
    current, legacy = naming.session_name(sid), naming.session_name(sid, legacy=True)
    secret = core_path(NS, "secrets", naming.runtime_secret_name(current))
    # Both names at once, then only the token's Secret: no read of the CR after the
    # create, none after the watch event.
    assert kube.most_at_once == 2
    names = [session_path(sid), custom_path(NS, crd.SESSION_PLURAL, legacy)]
    assert sorted(kube.reads[:2]) == sorted(names)
    assert kube.reads[2:] == [secret]
    # The watch began at the version the create answered (nothing in between is missed).
    made = kube.verbs("create")
    assert made == [session_path(sid)]
    assert len(kube.watches) == 1 and kube.watches[0]["resourceVersion"] == "1"


STATS = {
    "workspace_path": "/srv/node/ws",
    "started_at": "2026-11-28T00:00:00Z",
    "last_activity_at": "2026-11-28T00:00:00Z",
    "active_operations": 0,
    "conversations": 0,
}


@pytest.mark.parametrize("recorded", [True, False], ids=["path-in-status", "older-operator"])
def test_the_workspace_path_comes_from_the_status_not_the_runtime(recorded: bool) -> None:
    """Issue 39: a session whose status names ``workspacePath`` (the operator recorded the
    claim's answer) is ready for its first command with no request to its runtime — no
    ``GET /v1/stats`` before it; one without (an operator older than the field) asks the
    runtime once, and its pod's next look is answered from the cache."""
    caller = Caller(user_id=USER, via="dev")
    sid = caller.session_id
    asked: list[str] = []

    def runtime(request: httpx.Request) -> httpx.Response:
        asked.append(f"{request.method} {request.url.path}")
        return httpx.Response(200, json=STATS)

    path = "/srv/node/ws" if recorded else None
    kube = WatchedKube(lambda k: running(k, sid, path=path))
    service, caller = start(kube, runtime)
    session = asyncio.run(service.ensure_running(caller, sid))
    assert session.status == SessionStatus.RUNNING
    assert session.workspace_path == "/srv/node/ws"
    assert asked == ([] if recorded else ["GET /v1/stats"])
    again = asyncio.run(service.ensure_running(caller, sid))
    assert again.workspace_path == "/srv/node/ws"
    assert asked == ([] if recorded else ["GET /v1/stats"])


def test_a_known_session_is_read_under_its_own_name_alone() -> None:
    caller = Caller(user_id=USER, via="dev")
    sid = caller.session_id
    kube = WatchedKube(lambda k: running(k, sid))
    service, caller = start(kube)
    asyncio.run(service.ensure_running(caller, sid))
    kube.reads.clear()
    kube.most_at_once = 0
    asyncio.run(service.ensure_running(caller, sid))
    assert kube.reads == [session_path(sid)] and kube.most_at_once == 1


@pytest.mark.parametrize("event", ["another_owner", "deleted"])
def test_a_watch_event_not_of_the_sessions_own_cr_is_read_again(event: str) -> None:
    """An event whose object is another user's (a name planted meanwhile) or a deletion
    gives no session: the service reads the CR itself and judges that."""
    caller = Caller(user_id=USER, via="dev")
    sid = caller.session_id

    def on_watch(k: WatchedKube) -> dict:
        if len(k.watches) > 1:  # the second wait: the real Running
            return running(k, sid)
        if event == "deleted":
            return {"type": "DELETED", "object": dict(k.objects[session_path(sid)])}
        return running(k, sid, user="mallory") | {}  # not the caller's: never taken

    kube = WatchedKube(on_watch)
    service, caller = start(kube)
    if event == "another_owner":
        # The CR now names another user: the read after the event finds none of ours.
        with pytest.raises(Exception, match="deleted while starting"):
            asyncio.run(service.ensure_running(caller, sid))
        return
    session = asyncio.run(service.ensure_running(caller, sid))
    assert session.status == SessionStatus.RUNNING
    assert kube.reads.count(session_path(sid)) == 2  # the first look, the read after DELETED


def test_the_e2b_data_plane_reuses_a_callers_recent_running_answer_and_no_one_elses(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``recent_running`` (E2B's Start right after its create): no read within
    ``RECENT_SECONDS``; another tenant's user of the same name never gets this caller's
    answer; a deletion through the API and age end the reuse."""
    from sandbox_workspace.api import sessions

    ours = Caller(user_id=USER, via="dev")
    theirs = Caller(user_id=USER, via="dev", tenant="globex")
    by_name = {naming.session_name(c.session_id): c.session_id for c in (ours, theirs)}

    def on_watch(k: WatchedKube) -> dict:  # Running: the session the watch is for
        return running(k, by_name[k.watches[-1]["fieldSelector"].split("=", 1)[1]])

    kube = WatchedKube(on_watch)
    service, _ = start(kube)

    async def go() -> None:
        made = await service.ensure_running(ours, ours.session_id)
        kube.reads.clear()
        assert await service.recent_running(ours) is made
        assert kube.reads == []
        other = await service.recent_running(theirs)
        assert other.session_id == theirs.session_id != ours.session_id
        assert session_path(ours.session_id) not in kube.reads  # theirs read, not ours
        assert await service.recent_running(theirs) is other
        kube.reads.clear()
        service.forget(ours)
        assert (await service.recent_running(ours)).session_id == ours.session_id
        assert kube.reads == [session_path(ours.session_id)]
        assert await service.recent_running(theirs) is other  # theirs kept
        kube.reads.clear()
        monkeypatch.setattr(sessions, "RECENT_SECONDS", 0.0)
        await service.recent_running(ours)
        assert kube.reads == [session_path(ours.session_id)]

    asyncio.run(go())
