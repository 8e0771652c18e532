"""The API's ConversationWorkspace tracker, with a fake apiserver injected: created with
the finalizer, no round trip once known, refusal while deleting, and a watch that a
stale read can never overrule."""

from __future__ import annotations

import asyncio

import pytest

from sandbox_workspace.api.backends.base import ConversationExists, ConversationPhase, NameTaken
from sandbox_workspace.api.backends.kube_conversations import ConversationTracker
from sandbox_workspace.api.quotas import QuotaExceeded
from sandbox_workspace.contract.crd import ANNOTATION_FORK_ORIGIN
from sandbox_workspace.contract.errors import ConversationDeleting
from sandbox_workspace.kube import KubeConflict

COLLECTION = "/apis/x/v1/namespaces/ns/conversationworkspaces"


class FakeKube:
    def __init__(self) -> None:
        self.objects: dict[str, dict] = {}
        self.calls: list[tuple[str, str]] = []
        self.uids = 0

    async def request(self, method, path, body=None, content_type=None, params=None):
        self.calls.append((method, path))
        assert method == "POST" and path == COLLECTION
        name = body["metadata"]["name"]
        if name in self.objects:
            raise KubeConflict(409, "exists", "AlreadyExists")
        self.uids += 1
        obj = {**body, "metadata": {**body["metadata"], "uid": f"uid-{self.uids}"}}
        self.objects[name] = obj
        return obj

    async def get(self, path):
        self.calls.append(("GET", path))
        return self.objects.get(path.rsplit("/", 1)[1])

    async def delete(self, path, uid=None):
        self.calls.append(("DELETE", path))
        obj = self.objects.get(path.rsplit("/", 1)[1])
        if obj is None:
            return False
        obj["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
        return True


OWNER = ("sb-session-u", "c1")  # (sessionRef, conversationId)


def body(name: str, owner: tuple[str, str] = OWNER) -> dict:
    return {
        "metadata": {"name": name, "finalizers": ["sandboxworkspace.io/files"]},
        "spec": {"sessionRef": owner[0], "conversationId": owner[1]},
    }


def tracker(synced: bool) -> tuple[ConversationTracker, FakeKube]:
    kube = FakeKube()
    t = ConversationTracker(kube, COLLECTION)  # type: ignore[arg-type]
    t.synced = synced
    return t, kube


def test_known_conversations_cost_no_round_trip_once_synced():
    t, kube = tracker(synced=True)
    asyncio.run(t.ensure("w1", "c1", body("w1")))
    assert kube.objects["w1"]["metadata"]["finalizers"] == ["sandboxworkspace.io/files"]
    calls = len(kube.calls)
    for _ in range(5):
        asyncio.run(t.ensure("w1", "c1", body("w1")))
    assert len(kube.calls) == calls
    assert asyncio.run(t.phase("w1", OWNER)) == ConversationPhase.READY


def test_without_a_synced_watch_every_answer_is_read_and_nothing_cached():
    t, kube = tracker(synced=False)
    asyncio.run(t.ensure("w1", "c1", body("w1")))
    asyncio.run(t.ensure("w1", "c1", body("w1")))
    assert kube.calls.count(("POST", COLLECTION)) == 2  # the second: 409, then a GET
    asyncio.run(kube.delete(f"{COLLECTION}/w1"))
    assert asyncio.run(t.phase("w1", OWNER)) == ConversationPhase.DELETING
    with pytest.raises(ConversationDeleting):
        asyncio.run(t.ensure("w1", "c1", body("w1")))


def test_a_deletion_seen_by_the_watch_refuses_writes_and_then_allows_a_fresh_start():
    t, kube = tracker(synced=True)
    asyncio.run(t.ensure("w1", "c1", body("w1")))
    obj = kube.objects["w1"]
    t._apply("MODIFIED", {**obj, "metadata": {**obj["metadata"], "deletionTimestamp": "now"}})
    with pytest.raises(ConversationDeleting) as refused:
        asyncio.run(t.ensure("w1", "c1", body("w1")))
    assert refused.value.status == 409 and refused.value.code == "conversation_deleting"
    t._apply("DELETED", obj)
    del kube.objects["w1"]
    assert asyncio.run(t.phase("w1", OWNER)) == ConversationPhase.ABSENT
    asyncio.run(t.ensure("w1", "c1", body("w1")))
    assert kube.objects["w1"]["metadata"]["uid"] != obj["metadata"]["uid"]


def test_a_stale_read_cannot_resurrect_what_the_watch_saw_deleted():
    t, kube = tracker(synced=True)
    asyncio.run(t.ensure("w1", "c1", body("w1")))
    stale = kube.objects["w1"]
    t._apply("DELETED", stale)
    t._record(stale)  # e.g. a GET answered before the deletion, processed after it
    assert asyncio.run(t.phase("w1", OWNER)) == ConversationPhase.ABSENT


def test_our_own_delete_refuses_writes_at_once():
    t, _kube = tracker(synced=True)
    asyncio.run(t.ensure("w1", "c1", body("w1")))
    assert asyncio.run(t.delete("w1", OWNER)) is True
    with pytest.raises(ConversationDeleting):
        asyncio.run(t.ensure("w1", "c1", body("w1")))
    assert asyncio.run(t.delete("nope", OWNER)) is False


# -- whose object: a name never proves it ----------------------------------------------

VICTIM = ("sb-session-victim", "c9")


@pytest.mark.parametrize("synced", [True, False], ids=["synced", "unsynced"])
def test_another_owners_object_under_the_name_is_never_adopted(synced):
    t, _kube = tracker(synced=synced)
    asyncio.run(t.ensure("w1", "c9", body("w1", VICTIM)))  # the victim's, first
    with pytest.raises(NameTaken):
        asyncio.run(t.ensure("w1", "c1", body("w1")))
    assert asyncio.run(t.phase("w1", OWNER)) == ConversationPhase.ABSENT
    assert asyncio.run(t.phase("w1", VICTIM)) == ConversationPhase.READY


@pytest.mark.parametrize("synced", [True, False], ids=["synced", "unsynced"])
def test_deleting_never_deletes_another_owners_object(synced):
    t, kube = tracker(synced=synced)
    asyncio.run(t.ensure("w1", "c9", body("w1", VICTIM)))
    assert asyncio.run(t.delete("w1", OWNER)) is False
    assert "deletionTimestamp" not in kube.objects["w1"]["metadata"]
    assert ("DELETE", f"{COLLECTION}/w1") not in kube.calls


def test_a_legacy_name_is_used_only_when_it_holds_the_owners_object():
    t, _kube = tracker(synced=True)
    asyncio.run(t.ensure("legacy", "c1", body("legacy")))  # made before the upgrade
    assert asyncio.run(t.resolve(["current", "legacy"], OWNER)) == "legacy"
    t2, _ = tracker(synced=True)
    asyncio.run(t2.ensure("legacy", "c9", body("legacy", VICTIM)))  # another's
    assert asyncio.run(t2.resolve(["current", "legacy"], OWNER)) == "current"


def labelled(name: str, session: str) -> dict:
    b = body(name)
    b["metadata"]["labels"] = {"sandboxworkspace.io/session": session}
    return b


def test_a_session_past_its_conversation_cap_is_refused_before_any_create():
    kube = FakeKube()
    t = ConversationTracker(kube, COLLECTION, max_per_session=2)  # type: ignore[arg-type]
    t.synced = True
    for name in ("w1", "w2"):
        asyncio.run(t.ensure(name, name, labelled(name, "s1")))
    posts = kube.calls.count(("POST", COLLECTION))
    with pytest.raises(QuotaExceeded, match="cap of 2"):
        asyncio.run(t.ensure("w3", "w3", labelled("w3", "s1")))
    assert kube.calls.count(("POST", COLLECTION)) == posts  # nothing created
    asyncio.run(t.ensure("w1", "w1", labelled("w1", "s1")))  # a known one passes
    asyncio.run(t.ensure("x1", "x1", labelled("x1", "s2")))  # another session's own count


def fork_body(name: str, origin: str) -> dict:
    b = body(name)
    b["metadata"]["annotations"] = {ANNOTATION_FORK_ORIGIN: origin}
    return b


@pytest.mark.parametrize("synced", [True, False])
def test_a_forks_create_carries_its_origin_and_takes_no_other_conversation(synced):
    """A fork's conversation is created with its origin annotation; asked again by the
    same fork (cut off after the create) it is accepted; by another fork, or when the
    conversation was made otherwise (no annotation), it is 409 ``conversation_exists``
    — also when the other object was made between the caller's look and its create."""
    t, kube = tracker(synced)
    asyncio.run(t.ensure("w1", "c1", fork_body("w1", "A"), fork=True))
    assert kube.objects["w1"]["metadata"]["annotations"][ANNOTATION_FORK_ORIGIN] == "A"
    assert asyncio.run(t.fork_origin("w1", OWNER)) == "A"
    asyncio.run(t.ensure("w1", "c1", fork_body("w1", "A"), fork=True))  # the same fork
    with pytest.raises(ConversationExists):
        asyncio.run(t.ensure("w1", "c1", fork_body("w1", "B"), fork=True))
    asyncio.run(t.ensure("w1", "c1", body("w1")))  # an ordinary write to it: still a fork's

    plain = ("sb-session-u", "c2")
    asyncio.run(t.ensure("w2", "c2", body("w2", plain)))  # made otherwise
    assert asyncio.run(t.fork_origin("w2", plain)) == ""
    fork = fork_body("w2", "A")
    fork["spec"]["conversationId"] = "c2"
    with pytest.raises(ConversationExists):
        asyncio.run(t.ensure("w2", "c2", fork, fork=True))
    assert asyncio.run(t.fork_origin("w1", ("sb-session-x", "c1"))) == ""  # not theirs
