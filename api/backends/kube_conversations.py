"""The ConversationWorkspaces of one namespace, as the API's write paths need them.

Contract:
- ``ensure(name, body)`` makes sure the resource exists before anything of its
  conversation is written: it is created with ``metadata.finalizers`` already set, so a
  deletion can never complete without the operator deleting the files — even when the
  operator is down when the deletion arrives. Known to exist → no apiserver call at all
  (the hot path of every upload and execution). Being deleted → ``ConversationDeleting``.
- ``phase(name)`` is READY / DELETING / ABSENT from an informer-style cache: one list,
  then a watch that keeps it current (also for deletions made by another API replica or
  kubectl). While the watch is not synced (starting, apiserver restarting) every answer
  is read from the apiserver and nothing is cached — a stale READY is what would let a
  write through a deletion.
- ``ensure`` refuses a new conversation (409 ``quota_exceeded``) once its session holds
  ``max_per_session`` ConversationWorkspaces (counted from the cache by the session
  label; while not synced, from the apiserver), so no user can fill etcd.
- A read answer never overrides what the watch already said: the uids of deleted
  resources are remembered (bounded), so a GET or POST that raced a DELETED event cannot
  bring the dead resource back into the cache.
- ``ensure(..., fork=True)`` (a fork's new conversation, ``body`` carrying its origin
  annotation): an existing object is accepted only when it carries the same origin (the
  same fork made it, then was cut off) — any other is 409 ``conversation_exists``, so a
  fork never writes into a conversation made otherwise, even one made between its
  caller's look and its create. ``fork_origin`` answers the annotation's value.
- Every answer is for one owner, (``sessionRef``, ``conversationId``) (kube_owners): an
  object of another owner under the name is ABSENT to ``phase``, ``NameTaken`` (409) to
  ``ensure`` (never adopted), and left alone by ``delete`` (which deletes by uid).
  ``resolve`` picks, of a conversation's candidate names (current, legacy), the one
  holding its own object, else the current one.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import Any

import httpx

from sandbox_workspace.contract.crd import ANNOTATION_FORK_ORIGIN, LABEL_SESSION
from sandbox_workspace.contract.errors import ConversationDeleting
from sandbox_workspace.kube import Kube, KubeConflict, KubeError

from ..quotas import QuotaExceeded
from .base import ConversationExists, ConversationPhase, NameTaken
from .kube_owners import workspace_owner

log = logging.getLogger(__name__)

_PAGE = 500
_WATCH_SECONDS = 240
_RETRY_SECONDS = 0.5
_TOMBSTONES = 10_000


@dataclass(frozen=True)
class Known:
    uid: str
    deleting: bool
    owner: tuple[str, str] = ("", "")  # (sessionRef, conversationId)
    session: str = ""  # the SandboxSession's name (its label)
    fork_origin: str = ""  # the fork-origin annotation ("": not made by a fork)

    @property
    def phase(self) -> ConversationPhase:
        return ConversationPhase.DELETING if self.deleting else ConversationPhase.READY


def known_from(obj: dict[str, Any]) -> Known:
    meta = obj["metadata"]
    return Known(
        uid=meta["uid"],
        deleting=bool(meta.get("deletionTimestamp")),
        owner=workspace_owner(obj),
        session=(meta.get("labels") or {}).get(LABEL_SESSION, ""),
        fork_origin=str((meta.get("annotations") or {}).get(ANNOTATION_FORK_ORIGIN, "")),
    )


class ConversationTracker:
    def __init__(self, kube: Kube, collection: str, max_per_session: int | None = None) -> None:
        """``collection``: the namespace's conversationworkspaces path."""
        self.kube = kube
        self.max_per_session = max_per_session
        self.collection = collection
        self._known: dict[str, Known] = {}
        self._dead: OrderedDict[str, None] = OrderedDict()  # uids the watch saw deleted
        self.synced = False
        self._task: asyncio.Task | None = None

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="conversation-watch")

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    # -- reads and writes ------------------------------------------------------------

    async def _lookup(self, name: str) -> Known | None:
        if self.synced:
            return self._known.get(name)
        obj = await self.kube.get(f"{self.collection}/{name}")
        return known_from(obj) if obj else None

    async def resolve(self, names: list[str], owner: tuple[str, str]) -> str:
        """The first of ``names`` holding ``owner``'s object, else the first (current)."""
        for name in names:
            known = await self._lookup(name)
            if known is not None and known.owner == owner:
                return name
        return names[0]

    async def phase(self, name: str, owner: tuple[str, str]) -> ConversationPhase:
        known = await self._lookup(name)
        if known is None or known.owner != owner:
            return ConversationPhase.ABSENT  # another owner's object is none of ours
        return known.phase

    async def fork_origin(self, name: str, owner: tuple[str, str]) -> str:
        known = await self._lookup(name)
        return known.fork_origin if known is not None and known.owner == owner else ""

    async def ensure(
        self, name: str, conversation_id: str, body: dict[str, Any], fork: bool = False
    ) -> None:
        owner = workspace_owner(body)
        origin = body["metadata"]["annotations"].get(ANNOTATION_FORK_ORIGIN, "") if fork else None
        if self.synced:
            known = self._known.get(name)
            if known is not None:
                _check(known, owner, conversation_id, origin)
                return  # the hot path: no apiserver round trip
        await self._check_quota(body)
        try:
            self._record(await self.kube.request("POST", self.collection, body))
            return
        except KubeConflict:
            pass
        obj = await self.kube.get(f"{self.collection}/{name}")
        if obj is None:  # deleted between our create and our read: create afresh
            self._record(await self.kube.request("POST", self.collection, body))
            return
        self._record(obj)
        _check(known_from(obj), owner, conversation_id, origin)

    async def _check_quota(self, body: dict[str, Any]) -> None:
        cap = self.max_per_session
        if cap is None:
            return
        session = body["metadata"].get("labels", {}).get(LABEL_SESSION, "")
        if self.synced:
            held = sum(1 for k in self._known.values() if k.session == session)
        else:
            params = {"labelSelector": f"{LABEL_SESSION}={session}", "limit": str(cap + 1)}
            page = await self.kube.request("GET", self.collection, params=params)
            held = len(page.get("items", []))
        if held >= cap:
            raise QuotaExceeded("conversations of this user", cap, "conversations_per_user")

    async def delete(self, name: str, owner: tuple[str, str]) -> bool:
        """Request deletion of ``owner``'s object; False when there was none to delete."""
        known = await self._lookup(name)
        if known is None or known.owner != owner:
            return False
        # By uid: what is deleted is the object whose owner was compared, never a
        # successor of another owner made meanwhile under the name.
        gone = not await self.kube.delete(f"{self.collection}/{name}", uid=known.uid)
        if not gone and name in self._known:  # our own writes refuse at once
            self._known[name] = replace(known, deleting=True)
        return not gone

    def _record(self, obj: dict[str, Any] | None) -> None:
        if not obj or not self.synced:
            return
        known = known_from(obj)
        if known.uid not in self._dead:
            self._known[obj["metadata"]["name"]] = known

    # -- the watch -------------------------------------------------------------------

    async def _run(self) -> None:
        while True:
            try:
                version = await self._list()
                self.synced = True
                while version is not None:
                    version = await self._watch(version)
            except asyncio.CancelledError:
                raise
            except (KubeError, httpx.HTTPError, ValueError, KeyError) as e:
                log.warning("conversation watch interrupted: %s; re-listing", e)
            self.synced = False
            await asyncio.sleep(_RETRY_SECONDS)

    async def _list(self) -> str:
        """Fill the cache from a full (paged) list; the version to watch from."""
        self.synced = False
        known: dict[str, Known] = {}
        params = {"limit": str(_PAGE)}
        version = ""
        while True:
            page = await self.kube.request("GET", self.collection, params=params)
            version = version or page["metadata"]["resourceVersion"]
            for obj in page.get("items", []):
                known[obj["metadata"]["name"]] = known_from(obj)
            token = page["metadata"].get("continue")
            if not token:
                break
            params = {"limit": str(_PAGE), "continue": token}
        self._known = known
        return version

    async def _watch(self, version: str) -> str | None:
        """Apply events from ``version`` on; the version to continue from, or None when
        the history is gone (re-list)."""
        params = {
            "watch": "true",
            "resourceVersion": version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(_WATCH_SECONDS),
        }
        token = self.kube.credentials.bearer()
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        timeout = httpx.Timeout(10.0, read=_WATCH_SECONDS + 30)
        async with self.kube.http.stream(
            "GET", self.collection, params=params, headers=headers, timeout=timeout
        ) as response:
            if response.status_code >= 400:
                await response.aread()
                raise KubeError(response.status_code, response.text[:300])
            async for line in response.aiter_lines():
                if not line:
                    continue
                event = json.loads(line)
                obj = event.get("object") or {}
                if event.get("type") == "ERROR":
                    return None  # 410 Gone and friends: start over from a list
                version = obj.get("metadata", {}).get("resourceVersion", version)
                self._apply(event["type"], obj)
        return version

    def _apply(self, kind: str, obj: dict[str, Any]) -> None:
        if kind == "BOOKMARK":
            return
        name = obj["metadata"]["name"]
        if kind == "DELETED":
            uid = obj["metadata"]["uid"]
            self._dead[uid] = None
            while len(self._dead) > _TOMBSTONES:
                self._dead.popitem(last=False)
            current = self._known.get(name)
            if current is not None and current.uid == uid:
                del self._known[name]
            return
        self._known[name] = known_from(obj)


def _check(
    known: Known, owner: tuple[str, str], conversation_id: str, origin: str | None = None
) -> None:
    """An existing object, for a write of ``owner``'s (``origin``: a fork's, whose
    origin annotation it must carry)."""
    if known.owner != owner:
        log.warning("conversation %r: its resource name holds %r's object", owner, known.owner)
        raise NameTaken(
            f"conversation '{conversation_id}': its resource name is taken by another "
            "owner's ConversationWorkspace; use another conversation id"
        )
    if known.deleting:
        raise ConversationDeleting(conversation_id)
    if origin is not None and known.fork_origin != origin:
        raise ConversationExists(f"conversation '{conversation_id}' exists already")
