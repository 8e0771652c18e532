"""The kubernetes backend compares the owner on every read (api/backends/kube_owners.py):
an object of another owner under a session's or conversation's name is never shared,
adopted or deleted; objects made under the legacy 32-bit names are found and kept.
With the fake apiserver (tests/support/fake_kube.py)."""

from __future__ import annotations

import asyncio
import base64

import httpx
import pytest

from sandbox_workspace.api.backends.base import NameTaken, SessionSpec, SessionStatus
from sandbox_workspace.api.backends.kubernetes import KubernetesBackend
from sandbox_workspace.contract import crd
from sandbox_workspace.kube import core_path, custom_path
from sandbox_workspace.operator import naming
from tests.support.fake_kube import FakeKube

NS = "sessions"
# security-2026-11-28 H1: both users' sessions had one name under the 32-bit hash.
VICTIM, ATTACKER = "PRobEuSeR._...___", "probeuSEr.__....."


def backend() -> tuple[KubernetesBackend, FakeKube]:
    kube = FakeKube()
    http = httpx.AsyncClient(transport=httpx.MockTransport(lambda r: httpx.Response(503)))
    return KubernetesBackend(kube, NS, http), kube  # type: ignore[arg-type]


def session_cr(name: str, user: str, *, tenant: str | None = None, phase: str = "Pending"):
    annotations = {crd.ANNOTATION_TENANT_ID: tenant} if tenant else {}
    return {
        "metadata": {"name": name, "annotations": annotations},
        "spec": {"userId": user},
        "status": {"phase": phase},
    }


def sessions(name: str) -> str:
    return custom_path(NS, crd.SESSION_PLURAL, name)


def workspaces(name: str) -> str:
    return custom_path(NS, crd.WORKSPACE_PLURAL, name)


def test_a_session_cr_of_another_user_under_the_name_is_not_read() -> None:
    b, kube = backend()
    sid = naming.session_id_for("alice")
    kube.put(sessions(naming.session_name(sid)), session_cr("x", "mallory"))
    assert asyncio.run(b.get_session(sid)) is None
    assert asyncio.run(b.delete_session(sid)) is False
    assert kube.verbs("delete") == []


def test_a_session_cr_of_another_tenant_under_the_name_is_not_read() -> None:
    b, kube = backend()
    sid = naming.session_id_for("42", "acme")
    kube.put(sessions(naming.session_name(sid)), session_cr("x", "42", tenant="globex"))
    assert asyncio.run(b.get_session(sid)) is None
    kube.put(sessions(naming.session_name(sid)), session_cr("x", "42", tenant="acme"))
    assert asyncio.run(b.get_session(sid)).spec.user_id == "42"


def test_the_old_collision_gets_the_attacker_a_session_of_their_own() -> None:
    b, kube = backend()
    victim, attacker = naming.session_id_for(VICTIM), naming.session_id_for(ATTACKER)
    legacy = naming.session_name(victim, legacy=True)
    assert legacy == naming.session_name(attacker, legacy=True)
    kube.put(sessions(legacy), session_cr(legacy, VICTIM))  # made before the upgrade
    assert asyncio.run(b.get_session(attacker)) is None  # the victim's: not the attacker's
    made = asyncio.run(b.create_session(SessionSpec(session_id=attacker, user_id=ATTACKER)))
    assert made.spec.user_id == ATTACKER
    assert sessions(naming.session_name(attacker)) in kube.objects
    assert kube.objects[sessions(legacy)]["spec"]["userId"] == VICTIM  # untouched
    assert asyncio.run(b.get_session(victim)).spec.user_id == VICTIM  # still the victim's


def test_a_session_made_under_its_legacy_name_keeps_working() -> None:
    b, kube = backend()
    sid = naming.session_id_for(VICTIM)
    legacy = naming.session_name(sid, legacy=True)
    cr = session_cr(legacy, VICTIM, phase="Running")
    started = "2026-11-01T00:00:00Z"
    cr["status"] |= {"endpoint": "http://10.0.0.1:8080", "podName": "p", "startedAt": started}
    kube.put(sessions(legacy), cr)
    secret = naming.runtime_secret_name(legacy, legacy=True)  # no names annotation: legacy
    token = base64.b64encode(b"tok").decode()
    kube.put(core_path(NS, "secrets", secret), {"data": {"token": token}})
    session = asyncio.run(b.get_session(sid))
    assert session.status == SessionStatus.RUNNING and session.endpoint.token == "tok"
    # Its conversation's legacy workspace is adopted, not duplicated under a new name.
    cws = naming.workspace_name(legacy, "c1", legacy=True)
    kube.put(workspaces(cws), {"spec": {"sessionRef": legacy, "conversationId": "c1"}})
    asyncio.run(b.conversation_opened(session, "c1"))
    assert kube.verbs("create") == [workspaces(cws)]  # create-if-absent: 409, then read
    assert [p for p in kube.objects if "/conversationworkspaces/" in p] == [workspaces(cws)]
    assert asyncio.run(b.delete_conversation(session, "c1")) is False  # the finalizer's job
    assert kube.verbs("delete") == [workspaces(cws)]
    assert asyncio.run(b.delete_session(sid)) is True
    assert sessions(legacy) not in kube.objects


@pytest.mark.parametrize("where", ["current", "legacy"])
def test_a_workspace_of_another_owner_under_the_name_is_never_adopted(where: str) -> None:
    b, kube = backend()
    sid = naming.session_id_for("alice")
    name = naming.session_name(sid)
    kube.put(sessions(name), session_cr(name, "alice"))
    session = asyncio.run(b.get_session(sid))
    cws = naming.workspace_name(name, "c1", legacy=where == "legacy")
    planted = {"spec": {"sessionRef": "sb-session-mallory", "conversationId": "c1"}}
    kube.put(workspaces(cws), planted)
    if where == "current":
        with pytest.raises(NameTaken):
            asyncio.run(b.conversation_opened(session, "c1"))
    else:  # a legacy name is looked at only for the owner's own object: a new one is made
        asyncio.run(b.conversation_opened(session, "c1"))
        assert kube.verbs("create") == [workspaces(naming.workspace_name(name, "c1"))]
    assert workspaces(cws) not in kube.verbs("delete")
    assert kube.objects[workspaces(cws)]["spec"]["sessionRef"] == "sb-session-mallory"
