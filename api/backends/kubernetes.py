"""The ``kubernetes`` backend: sessions are SandboxSession resources the operator reconciles.

Contract:
- ``create_session`` creates the CR (409 → ``SessionExists``); the operator makes the pod.
- ``get_session`` maps the CR's ``status.phase`` to the seed's four states; ``running``
  needs an endpoint too. The runtime's bearer token is read from the session's Secret
  (cached per session uid). The workspace path — under a test node agent it is not
  ``/workspace`` — is the status's ``workspacePath`` (the operator records what the
  runtime named: no round trip before a new session's first command, issue 39); a
  status without it (an operator older than the field, or before its first look) has it
  asked of the runtime itself (``GET /v1/stats``, cached per pod incarnation).
- ``resume_session`` sets the ``resume-requested`` annotation; the operator starts a pod.
- ``wait_changed`` watches the one CR (bounded) from the version last seen (a read, or
  the create's answer), so waiting for ``running`` is woken by the change instead of
  polling, and answers the session as the event's object has it (no read after it).
- A session this process has not seen yet is looked for under its current and legacy
  names at once (one round trip for a new user, not two); a known one under its own.
- A session with a ``deletionTimestamp`` is ``terminating`` (no traffic goes to it); one
  carrying the ``resume-requested`` annotation is ``resume_pending`` — the operator
  removes the annotation once it has acted, so its status is not judged before that.
- Conversations (``kube_conversations.ConversationTracker``): ``conversation_opened``
  creates the ConversationWorkspace with its finalizer before the first byte is
  written (cached: no round trip once known); ``fork_opened`` creates a fork's with its
  origin annotated in the create (``fork_origin`` reads it); ``conversation_phase``
  reads the watched cache; ``delete_conversation`` deletes the CR and returns at once —
  the operator's finalizer deletes the files and verifies they are gone, and the CR disappears only
  then. A conversation that never had a CR is deleted through the runtime directly
  when the session runs, and is already gone when it does not (nothing is started).
- ``delete_session`` deletes the CR; owner references take the pod, Secret, claim and
  workspaces with it.
- Whose object: every read compares the owner the CR records with the caller's ids
  (``kube_owners``); another owner's CR under the name is absent (404), never shared,
  adopted or deleted. A session or conversation made before 2026-11-28 keeps its legacy
  (32-bit hash) name: it is found there when its current name holds nothing of its own.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import secrets
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import httpx

from sandbox_workspace import tracing
from sandbox_workspace.contract import crd
from sandbox_workspace.contract.conditions import ConditionType
from sandbox_workspace.contract.errors import ApiError, Conflict, ConversationDeleting
from sandbox_workspace.egress.policy import EgressPolicy
from sandbox_workspace.kube import Kube, KubeConflict, core_path, custom_path
from sandbox_workspace.operator import models, naming

from ..runtime_client import RuntimeClient
from .base import (
    ConversationPhase,
    ForkOrigin,
    NameTaken,
    RuntimeEndpoint,
    Session,
    SessionExists,
    SessionSpec,
    SessionStatus,
    StoreFence,
)
from .kube_conversations import ConversationTracker
from .kube_owners import (
    session_candidates,
    session_owned,
    workspace_candidates,
    workspace_owner,
)

log = logging.getLogger(__name__)

_PHASES = {
    "Pending": SessionStatus.PENDING,
    "Running": SessionStatus.RUNNING,
    "Stopped": SessionStatus.STOPPED,
    "Error": SessionStatus.ERROR,
}
POD_WORKSPACE = "/workspace"


def session_body(
    spec: SessionSpec,
    *,
    idle_timeout_seconds: int | None,
    storage: models.StorageSpec | None,
    network_enabled: bool,
    limits: models.ExecutionLimits | None = None,
    egress: models.EgressSpec | None = None,
) -> dict:
    """The SandboxSession a caller's spec becomes, with the API's defaults for new
    sessions (idle timeout, storage, network) applied; pure, so it is tested whole."""
    body_spec = models.SandboxSessionSpec(
        user_id=spec.user_id,
        agent_id=spec.agent_id or None,
        business_domain_id=spec.business_domain_id or None,
        ttl_seconds=spec.ttl_seconds,
        file_upload_config=spec.file_upload,
        **(
            {"idle_timeout_seconds": idle_timeout_seconds}
            if idle_timeout_seconds is not None
            else {}
        ),
        **({"storage": storage} if storage is not None else {}),
        **({"network": models.NetworkSpec(enabled=True)} if network_enabled else {}),
        **({"limits": limits} if limits is not None else {}),
        egress=egress,
    )
    return {
        "apiVersion": crd.API_VERSION,
        "kind": crd.SESSION_KIND,
        "metadata": {
            "name": naming.session_name(spec.session_id),
            "labels": {crd.LABEL_USER: naming.dns_name(spec.user_id)},
            "annotations": {
                crd.ANNOTATION_USER_ID: spec.user_id,
                # Its pod, Secret and claim get current (64-bit hash) names.
                naming.ANNOTATION_NAMES: naming.NAMES_CURRENT,
                **_tenant(spec.session_id),
            },
        },
        "spec": body_spec.model_dump(by_alias=True, exclude_none=True),
    }


class KubernetesBackend:
    def __init__(
        self,
        kube: Kube,
        namespace: str,
        http: httpx.AsyncClient,
        *,
        idle_timeout_seconds: int | None = None,
        storage: models.StorageSpec | None = None,
        network_enabled: bool = False,
        limits: models.ExecutionLimits | None = None,
        max_conversations: int | None = None,
        egress: models.EgressSpec | None = None,
    ) -> None:
        """``max_conversations``: ConversationWorkspaces one session may hold;
        ``egress``: the egress policy of new sessions (None: none)."""
        self.kube = kube
        self.egress = egress
        self.limits = limits
        self.network_enabled = network_enabled
        self.namespace = namespace
        self.http = http
        self.idle_timeout_seconds = idle_timeout_seconds
        self.storage = storage
        self._tokens: dict[str, str] = {}  # session uid → runtime token
        self._workspace_paths: dict[tuple, str] = {}  # (endpoint, pod incarnation) → path
        self._seen_versions: dict[str, str] = {}  # CR name → resourceVersion last read
        self._names: dict[str, str] = {}  # session id → its CR's name (current or legacy)
        self.conversations = ConversationTracker(kube, self._workspaces(), max_conversations)

    async def start(self) -> None:
        await self.conversations.start()

    async def aclose(self) -> None:
        await self.conversations.aclose()
        await self.kube.aclose()

    # -- paths -------------------------------------------------------------------------

    def _sessions(self, name: str | None = None) -> str:
        return custom_path(self.namespace, crd.SESSION_PLURAL, name)

    def _workspaces(self, name: str | None = None) -> str:
        return custom_path(self.namespace, crd.WORKSPACE_PLURAL, name)

    def _name(self, session_id: str) -> str | None:
        """The CR name last read as this session's own (``_read``), else the current one."""
        return self._names.get(session_id) or naming.session_name(session_id)

    # -- sessions ----------------------------------------------------------------------

    async def _read(self, session_id: str) -> dict[str, Any] | None:
        """The session's own CR: under its current name, else its legacy one; an object
        of another owner under either is not it (kube_owners). Both names are asked at
        once for a session not seen yet (a new user's first call: one round trip)."""
        names = session_candidates(session_id)
        if session_id in self._names or len(names) == 1:
            found = [await self.kube.get(self._sessions(names[0]))]
            if found[0] is None or not session_owned(found[0], session_id):
                found += [await self.kube.get(self._sessions(n)) for n in names[1:]]
        else:
            found = list(await asyncio.gather(*(self.kube.get(self._sessions(n)) for n in names)))
        for name, obj in zip(names, found, strict=False):
            if obj is None:
                self._seen_versions.pop(name, None)
            elif session_owned(obj, session_id):
                self._remember(session_id, obj)
                return obj
            else:
                log.warning("session %r: CR %s belongs to another owner", session_id, name)
        return None

    def _remember(self, session_id: str, obj: dict[str, Any]) -> None:
        """``obj`` (the session's own CR) is the version last seen under its name."""
        name = obj["metadata"]["name"]
        self._seen_versions[name] = obj["metadata"]["resourceVersion"]
        _bounded(self._names)
        self._names[session_id] = name

    async def get_session(self, session_id: str) -> Session | None:
        obj = await self._read(session_id)
        return None if obj is None else await self._to_session(session_id, obj)

    async def _to_session(self, session_id: str, obj: dict[str, Any]) -> Session:
        spec = models.SandboxSessionSpec.model_validate(obj.get("spec", {}))
        status = models.SandboxSessionStatus.model_validate(obj.get("status") or {})
        state = _PHASES.get(status.phase or "Pending", SessionStatus.PENDING)
        endpoint = None
        workspace_path = POD_WORKSPACE
        if state == SessionStatus.RUNNING:
            if status.endpoint:
                token = await self._token(obj)
                pod = f"{status.pod_name}@{status.started_at}"
                endpoint = (
                    RuntimeEndpoint(url=status.endpoint, token=token, incarnation=pod)
                    if token
                    else None
                )
            if endpoint is None:
                state = SessionStatus.PENDING
            elif status.workspace_path:  # the operator recorded the runtime's answer
                workspace_path = status.workspace_path
            else:
                # Keyed by the pod's incarnation too: a new pod may reuse an address.
                incarnation = (endpoint.url, status.pod_name, status.started_at)
                workspace_path = await self._workspace_path(endpoint, incarnation)
        meta = obj["metadata"]
        created = meta.get("creationTimestamp")
        return Session(
            spec=SessionSpec(
                session_id=session_id,
                user_id=spec.user_id,
                agent_id=spec.agent_id or "",
                business_domain_id=spec.business_domain_id or "",
                file_upload=spec.file_upload_config,
                ttl_seconds=spec.ttl_seconds,
            ),
            status=state,
            created_at=datetime.fromisoformat(created) if created else datetime.now(UTC),
            workspace_path=workspace_path,
            message=_message(status),
            endpoint=endpoint,
            terminating=bool(meta.get("deletionTimestamp")),
            resume_pending=crd.ANNOTATION_RESUME in (meta.get("annotations") or {}),
        )

    async def _token(self, obj: dict[str, Any]) -> str | None:
        uid = obj["metadata"]["uid"]
        if uid not in self._tokens:
            meta = obj["metadata"]
            legacy = naming.legacy_children(meta.get("annotations"))
            name = naming.runtime_secret_name(meta["name"], legacy=legacy)
            secret = await self.kube.get(core_path(self.namespace, "secrets", name))
            data = (secret or {}).get("data", {}).get("token")
            if not data:
                return None
            _bounded(self._tokens)
            self._tokens[uid] = base64.b64decode(data).decode()
        return self._tokens[uid]

    async def _workspace_path(self, endpoint: RuntimeEndpoint, incarnation: tuple) -> str:
        if incarnation not in self._workspace_paths:
            try:
                stats = await RuntimeClient(self.http, endpoint).stats()
            except Exception:  # not answering yet: the pod's convention holds
                return POD_WORKSPACE
            _bounded(self._workspace_paths)
            self._workspace_paths[incarnation] = stats.workspace_path
        return self._workspace_paths[incarnation]

    async def create_session(self, spec: SessionSpec) -> Session:
        body = session_body(
            spec,
            idle_timeout_seconds=self.idle_timeout_seconds,
            storage=self.storage,
            network_enabled=self.network_enabled,
            egress=self.egress,
            limits=self.limits,
        )
        tracing.with_traceparent(body["metadata"]["annotations"], crd.ANNOTATION_TRACEPARENT)
        try:
            obj = await self.kube.request("POST", self._sessions(), body)
        except KubeConflict as e:
            raise SessionExists(f"session '{spec.session_id}' already exists") from e
        assert obj is not None
        self._remember(spec.session_id, obj)  # a wait for it watches from this version
        return await self._to_session(spec.session_id, obj)

    async def resume_session(self, session_id: str) -> Session:
        name = self._name(session_id)
        assert name is not None
        stamp = datetime.now(UTC).isoformat()
        annotations = {
            crd.ANNOTATION_RESUME: stamp,
            # The operator's resume is a child of this request (none: an old one is removed).
            crd.ANNOTATION_TRACEPARENT: tracing.traceparent(),
        }
        patched = await self.kube.patch(
            self._sessions(name), {"metadata": {"annotations": annotations}}
        )
        if patched is None:
            raise KeyError(session_id)
        session = await self.get_session(session_id)
        if session is None:
            raise KeyError(session_id)
        return session

    # -- egress policy (issue 40) -------------------------------------------------------

    async def egress_policy(self, session_id: str) -> EgressPolicy | None:
        obj = await self._read(session_id)
        if obj is None:
            raise KeyError(session_id)
        egress = models.SandboxSessionSpec.model_validate(obj.get("spec") or {}).egress
        return None if egress is None else egress.policy()

    async def set_egress_policy(self, session_id: str, policy: EgressPolicy | None) -> None:
        """A merge patch of ``spec.egress`` on the session's own CR, conditional on the
        version read (another owner's object under the name is never patched); the
        proxy sees it on its next look, no new pod needed."""
        # Only the rules: a merge patch leaves spec.egress.secrets (the platform's
        # bindings, set on the CR) as they are. None clears the whole policy.
        egress = (
            None
            if policy is None
            else models.EgressSpec.of(policy).model_dump(by_alias=True, include={"rules"})
        )
        for _ in range(3):
            obj = await self._read(session_id)
            if obj is None:
                raise KeyError(session_id)
            body = {
                "metadata": {"resourceVersion": obj["metadata"]["resourceVersion"]},
                "spec": {"egress": egress},
            }
            try:
                patched = await self.kube.patch(self._sessions(obj["metadata"]["name"]), body)
            except KubeConflict:
                continue  # changed since read (activity annotation): read again
            if patched is None:
                raise KeyError(session_id)
            return
        raise Conflict(f"session '{session_id}' kept changing; try again")

    async def delete_session(self, session_id: str) -> bool:
        obj = await self._read(session_id)
        if obj is None:
            return False
        meta = obj["metadata"]
        return await self.kube.delete(self._sessions(meta["name"]), uid=meta["uid"])

    async def wait_changed(self, session_id: str, timeout: float) -> Session | None:
        """Return when the session's CR changes, or after ``timeout`` seconds: the session
        as the watch event carried it (no second read) when it is the session's own CR
        and still there, else None (the caller reads it)."""
        name = self._name(session_id)
        if name is None:
            return None
        params = {
            "watch": "true",
            "fieldSelector": f"metadata.name={name}",
            "timeoutSeconds": str(max(1, int(timeout))),
        }
        if name in self._seen_versions:  # events since our last read are not missed
            params["resourceVersion"] = self._seen_versions[name]
        token = self.kube.credentials.bearer()
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        changed = None
        with contextlib.suppress(httpx.HTTPError, ValueError):
            async with self.kube.http.stream(
                "GET", self._sessions(), params=params, headers=headers, timeout=timeout + 5
            ) as response:
                async for line in response.aiter_lines():
                    event = json.loads(line) if line else {}
                    if event.get("type") in ("ADDED", "MODIFIED", "DELETED", "ERROR"):
                        changed = event
                        break
        obj = (changed or {}).get("object")
        if changed is None or changed["type"] not in ("ADDED", "MODIFIED"):
            return None
        if not _own(obj, name, session_id):
            return None
        self._remember(session_id, obj)
        return await self._to_session(session_id, obj)

    async def record_activity(self, session_id: str) -> None:
        """The operator counts the later of this and the runtime's own activity time."""
        name = self._name(session_id)
        if name is None:
            return
        stamp = datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
        await self.kube.patch(
            self._sessions(name),
            {"metadata": {"annotations": {crd.ANNOTATION_LAST_ACTIVITY: stamp}}},
        )

    # -- conversations -------------------------------------------------------------------

    def _session_name(self, session: Session) -> str:
        name = self._name(session.session_id)
        assert name is not None, "sessions are made only under ids of naming's forms"
        return name

    async def _workspace_name(self, session: Session, conversation_id: str) -> str:
        """The conversation's CR name: current, or legacy where its own object is."""
        ref = self._session_name(session)
        return await self.conversations.resolve(
            workspace_candidates(ref, conversation_id), (ref, conversation_id)
        )

    async def conversation_phase(self, session: Session, conversation_id: str) -> ConversationPhase:
        name = await self._workspace_name(session, conversation_id)
        owner = (self._session_name(session), conversation_id)
        return await self.conversations.phase(name, owner)

    async def conversation_opened(self, session: Session, conversation_id: str) -> None:
        name, body = await self._workspace_body(session, conversation_id)
        await self.conversations.ensure(name, conversation_id, body)

    async def fork_opened(self, session: Session, conversation_id: str, origin: ForkOrigin) -> None:
        """The origin is an annotation in the create itself: the resource never exists
        without it, and only the API (never a sandbox: its pods hold no token) writes
        ConversationWorkspaces."""
        name, body = await self._workspace_body(session, conversation_id)
        body["metadata"]["annotations"][crd.ANNOTATION_FORK_ORIGIN] = origin.to_json()
        await self.conversations.ensure(name, conversation_id, body, fork=True)

    async def fork_origin(self, session: Session, conversation_id: str) -> ForkOrigin | None:
        name = await self._workspace_name(session, conversation_id)
        owner = (self._session_name(session), conversation_id)
        return ForkOrigin.parse(await self.conversations.fork_origin(name, owner))

    async def _workspace_body(
        self, session: Session, conversation_id: str
    ) -> tuple[str, dict[str, Any]]:
        """The conversation's ConversationWorkspace as created: its name and body."""
        session_name = self._session_name(session)
        spec = models.ConversationWorkspaceSpec(
            conversation_id=conversation_id,
            session_ref=session_name,
            agent_id=session.spec.agent_id or None,
            user_id=session.spec.user_id,
        )
        name = await self._workspace_name(session, conversation_id)
        body = {
            "apiVersion": crd.API_VERSION,
            "kind": crd.WORKSPACE_KIND,
            "metadata": {
                "name": name,
                # Set at creation, not when the operator first sees it: a deletion while
                # the operator is down must still wait for the files to be deleted.
                "finalizers": [crd.FINALIZER_FILES],
                "labels": {
                    crd.LABEL_SESSION: session_name,
                    crd.LABEL_CONVERSATION: naming.dns_name(conversation_id),
                },
                "annotations": tracing.with_traceparent(
                    {
                        crd.ANNOTATION_CONVERSATION_ID: conversation_id,
                        crd.ANNOTATION_USER_ID: session.spec.user_id,
                        **_tenant(session.session_id),
                    },
                    crd.ANNOTATION_TRACEPARENT,
                ),
            },
            "spec": spec.model_dump(by_alias=True, exclude_none=True),
        }
        return name, body

    conversation_created = conversation_opened  # nothing more to know here

    async def conversation_written(self, session: Session, conversation_id: str) -> None:
        phase = await self.conversation_phase(session, conversation_id)
        if phase == ConversationPhase.READY:
            return
        assert session.endpoint is not None
        runtime = RuntimeClient(self.http, session.endpoint)
        if phase == ConversationPhase.ABSENT:
            # Gone meanwhile. Whatever this write left (if anything: a deletion that
            # stopped it also deleted its files) is tracked afresh, never left alone.
            if (await runtime.conversation_info(conversation_id)).exists:
                await self.conversation_opened(session, conversation_id)
            return
        # Being deleted: the finalizer may have deleted and verified already, before
        # this write landed — delete again so nothing outlives the resource.
        with contextlib.suppress(ApiError):
            await runtime.delete_conversation(conversation_id)
        raise ConversationDeleting(conversation_id)

    @contextlib.asynccontextmanager
    async def store_writing(
        self, session: Session, conversation_id: str
    ) -> AsyncIterator[StoreFence]:
        """The writer announces itself on the ConversationWorkspace (an annotation with a
        lease, ``crd.ANNOTATION_WRITER_PREFIX``) and withdraws when done. The patch's
        answer is the apiserver's current object: being deleted (or gone) → refused before
        anything is written. The finalizer waits while a live announcement is there, so
        every object of an announced writer has landed before it lists the prefix; a
        writer that outlived its lease (the finalizer may have gone on) is ``late``."""
        path = self._workspaces(await self._workspace_name(session, conversation_id))
        owner = (self._session_name(session), conversation_id)
        key = f"{crd.ANNOTATION_WRITER_PREFIX}w-{secrets.token_hex(8)}"
        lease_end = time.time() + crd.WRITER_LEASE_SECONDS
        obj = await self.kube.patch(path, _annotate(key, str(int(lease_end))))
        fence = StoreFence()
        foreign = obj is not None and workspace_owner(obj) != owner
        if obj is None or foreign or obj["metadata"].get("deletionTimestamp"):
            if obj is not None:
                await self.kube.patch(path, _annotate(key, None))
            if foreign:  # another owner's object under the name: withdrawn, refused
                raise NameTaken(f"conversation '{conversation_id}': its name is taken")
            raise ConversationDeleting(conversation_id)
        try:
            yield fence
        finally:
            obj = await asyncio.shield(self.kube.patch(path, _annotate(key, None)))
            ending = obj is None or obj["metadata"].get("deletionTimestamp")
            # A margin for the clocks of this process and the operator's.
            fence.late = bool(ending) and time.time() > lease_end - _LEASE_MARGIN

    async def delete_conversation(self, session: Session, conversation_id: str) -> bool:
        name = await self._workspace_name(session, conversation_id)
        owner = (self._session_name(session), conversation_id)
        if await self.conversations.delete(name, owner):
            return False  # the finalizer finishes the job; status shows progress
        if session.endpoint is None:
            # Not running, and no resource: nothing was written (a write opens the
            # conversation's resource first), and no pod is started to find that out.
            return True
        result = await RuntimeClient(self.http, session.endpoint).delete_conversation(
            conversation_id
        )
        return not result.exists


_CACHE_LIMIT = 10_000


def _tenant(session_id: str) -> dict[str, str]:
    """The tenant annotation of a session's resources; none in the default tenant (its
    resources stay exactly as before tenants had sessions of their own)."""
    tenant = naming.tenant_of(session_id)
    return {} if tenant in (None, naming.DEFAULT_TENANT) else {crd.ANNOTATION_TENANT_ID: tenant}


_LEASE_MARGIN = 5.0


def _annotate(key: str, value: str | None) -> dict:
    return {"metadata": {"annotations": {key: value}}}


def _own(obj: Any, name: str, session_id: str) -> bool:
    """Whether a watch event's object is the session's own CR under ``name``."""
    if not isinstance(obj, dict) or (obj.get("metadata") or {}).get("name") != name:
        return False
    return session_owned(obj, session_id) and "resourceVersion" in obj["metadata"]


def _bounded(cache: dict) -> None:
    """Caches keyed by incarnations only grow; past the limit, start over (cheap refill)."""
    if len(cache) >= _CACHE_LIMIT:
        cache.clear()


def _message(status: models.SandboxSessionStatus) -> str:
    for condition in status.conditions:
        if condition.type == ConditionType.READY and condition.status != "True":
            return condition.message or condition.reason
    return ""
