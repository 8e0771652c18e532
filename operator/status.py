"""Pure status logic: what a session's status is, given its pod. No I/O.

Contract: ``observe_pod`` reduces a pod (or its absence) to one ``PodState``;
``session_status`` turns that into the whole ``SandboxSessionStatus`` — phase, pod
fields, endpoint, and the Ready / Stopped / Expired conditions, whose
``lastTransitionTime`` only moves when their status changes; the runtime's
``workspacePath`` follows its pod start (kept while the pod and its start time are the
recorded ones, gone with them). ``Stopped`` is the one
thing a pod cannot show (no pod looks the same whether stopped or vanished), so it is
carried over from the previous status: a session stays Stopped until resumed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any, Literal

from sandbox_workspace.contract.conditions import ConditionType, Reason
from sandbox_workspace.contract.crd import ANNOTATION_RESUME, LABEL_POOL

from .models import (
    Condition,
    ConversationWorkspaceStatus,
    SandboxSession,
    SandboxSessionStatus,
    SessionPhase,
)
from .naming import runtime_pod_name
from .settings import RUNTIME_PORT

PodKind = Literal["missing", "pending", "starting", "ready", "failed", "terminating", "broken"]

# Waiting reasons no amount of waiting fixes: the session is in Error until its spec or
# the cluster changes (a recreated pod would fail the same way).
_BROKEN_WAITING = {
    "ErrImagePull",
    "ImagePullBackOff",
    "InvalidImageName",
    "CreateContainerConfigError",
    "CreateContainerError",
}


@dataclass(frozen=True)
class PodState:
    kind: PodKind
    reason: str
    message: str = ""
    ip: str | None = None
    started_at: str | None = None
    name: str | None = None
    started_from: Literal["pool", "cold"] | None = None  # None: no pod


def observe_pod(pod: dict[str, Any] | None) -> PodState:
    state = _observe_pod(pod)
    if pod is None:
        return state
    labels = (pod.get("metadata") or {}).get("labels") or {}
    return replace(state, started_from="pool" if LABEL_POOL in labels else "cold")


def session_pod_name(session: SandboxSession) -> str:
    """The name of the session's pod: its own (``runtime_pod_name``), or the one it
    claimed from the warm pool, which keeps its name (recorded in ``status.podName``)."""
    return session.status.pod_name or runtime_pod_name(session.name, legacy=session.legacy_children)


def _observe_pod(pod: dict[str, Any] | None) -> PodState:
    if pod is None:
        return PodState("missing", Reason.POD_MISSING, "the sandbox pod does not exist")
    meta, status = pod.get("metadata", {}), pod.get("status") or {}
    name, ip = meta.get("name"), status.get("podIP") or None
    if meta.get("deletionTimestamp"):
        return PodState(
            "terminating", Reason.POD_TERMINATING, "the sandbox pod is stopping", name=name
        )
    phase = status.get("phase") or "Pending"
    containers = status.get("containerStatuses") or []
    state = (containers[0].get("state") or {}) if containers else {}
    if phase in ("Failed", "Succeeded"):
        term = state.get("terminated") or {}
        code = term.get("exitCode")
        detail = f"the runtime exited with code {code}" if code is not None else "pod failed"
        reason = status.get("reason") or Reason.POD_FAILED
        return PodState("failed", reason, status.get("message") or detail, ip=ip, name=name)
    waiting = state.get("waiting") or {}
    unschedulable = next(
        (
            c
            for c in status.get("conditions") or []
            if c.get("type") == "PodScheduled" and c.get("reason") == Reason.UNSCHEDULABLE
        ),
        None,
    )
    if unschedulable is not None and phase == "Pending":
        # Reported, not replaced: the scheduler retries, and a new pod would wait the same.
        message = unschedulable.get("message") or "no node can run the sandbox pod"
        return PodState("pending", Reason.UNSCHEDULABLE, message, name=name)
    # "failed to sync secret/configmap cache": the kubelet's watch is not synced yet (a
    # node just started); it retries by itself, so this one waits like any pending pod.
    transient = "failed to sync" in waiting.get("message", "")
    if waiting.get("reason") in _BROKEN_WAITING and not transient:
        return PodState("broken", waiting["reason"], waiting.get("message", ""), ip=ip, name=name)
    started = (state.get("running") or {}).get("startedAt") or status.get("startTime")
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )
    if phase == "Running" and ready and ip:
        return PodState("ready", Reason.RUNTIME_READY, "the runtime answers", ip, started, name)
    if phase == "Running":
        reason = waiting.get("reason") or Reason.RUNTIME_NOT_READY
        msg = waiting.get("message") or "the runtime is starting"
        return PodState("starting", reason, msg, ip, started, name)
    reason = waiting.get("reason") or Reason.POD_PENDING
    return PodState(
        "pending", reason, waiting.get("message") or "waiting for the pod", ip, name=name
    )


def set_condition(
    conditions: list[Condition],
    type_: str,
    status: bool,
    reason: str,
    message: str,
    now: datetime,
) -> list[Condition]:
    """``conditions`` with ``type_`` set; the transition time moves only on a change."""
    value = "True" if status else "False"
    previous = next((c for c in conditions if c.type == type_), None)
    since = previous.last_transition_time if previous and previous.status == value else now
    new = Condition(
        type=type_, status=value, reason=reason, message=message, last_transition_time=since
    )
    return [c for c in conditions if c.type != type_] + [new]


def condition(
    status: SandboxSessionStatus | ConversationWorkspaceStatus, type_: str
) -> Condition | None:
    return next((c for c in status.conditions if c.type == type_), None)


def is_stopped(session: SandboxSession) -> bool:
    """Stopped by the operator and not asked to resume since."""
    return session.status.phase == "Stopped" and ANNOTATION_RESUME not in session.annotations


def expires_at(session: SandboxSession) -> datetime | None:
    if session.spec.ttl_seconds is None or session.creation_timestamp is None:
        return None
    return session.creation_timestamp + timedelta(seconds=session.spec.ttl_seconds)


_PHASES: dict[PodKind, SessionPhase] = {
    "missing": "Pending",
    "pending": "Pending",
    "starting": "Pending",
    "terminating": "Pending",
    "ready": "Running",
    "failed": "Error",
    "broken": "Error",
}


def session_status(
    session: SandboxSession,
    pod: PodState,
    now: datetime,
    *,
    stopped: bool = False,
    stop_reason: tuple[str, str] = (Reason.IDLE_TIMEOUT, "stopped after idleTimeoutSeconds"),
    restart_required: bool = False,
    workspace_path: str | None = None,
) -> SandboxSessionStatus:
    """The whole status of ``session`` given its pod (``stopped``: the pod is gone on
    purpose; ``stop_reason``: reason and message of that stop; ``restart_required``: the
    running pod was built from an older spec and is replaced once the session is idle;
    ``workspace_path``: what the pod's runtime named as its workspace root — its claim's
    answer — else the one recorded is kept while the status describes the same pod start).

    ``observedGeneration`` tells the truth: it moves to the spec's generation only when
    what runs (or the absence of a pod) reflects that spec."""
    prev = session.status
    conds = list(prev.conditions)
    if restart_required:
        conds = set_condition(
            conds,
            ConditionType.RESTART_REQUIRED,
            True,
            Reason.SPEC_CHANGED,
            "the spec changed; the pod is replaced with the new spec once the session is idle",
            now,
        )
    elif condition(prev, ConditionType.RESTART_REQUIRED) is not None:
        conds = set_condition(
            conds,
            ConditionType.RESTART_REQUIRED,
            False,
            Reason.UP_TO_DATE,
            "the pod runs the current spec",
            now,
        )
    if stopped:
        phase: SessionPhase = "Stopped"
        old = condition(prev, ConditionType.STOPPED)
        reason, message = (old.reason, old.message) if old and old.status == "True" else stop_reason
        conds = set_condition(
            conds, ConditionType.READY, False, Reason.STOPPED, "the session is stopped", now
        )
        conds = set_condition(conds, ConditionType.STOPPED, True, reason, message, now)
    else:
        phase = _PHASES[pod.kind]
        conds = set_condition(
            conds, ConditionType.READY, pod.kind == "ready", pod.reason, pod.message, now
        )
        was_stopped = condition(prev, ConditionType.STOPPED)
        if was_stopped and was_stopped.status == "True":
            conds = set_condition(
                conds, ConditionType.STOPPED, False, Reason.RESUMED, "resumed on request", now
            )
        elif was_stopped is None:
            conds = set_condition(
                conds, ConditionType.STOPPED, False, Reason.ACTIVE, "the session is active", now
            )
    expiry = expires_at(session)
    old_expired = condition(prev, ConditionType.EXPIRED)
    if not (old_expired and old_expired.status == "True"):
        if expiry is None:
            conds = set_condition(
                conds, ConditionType.EXPIRED, False, Reason.NO_TTL, "ttlSeconds is not set", now
            )
        else:
            conds = set_condition(
                conds,
                ConditionType.EXPIRED,
                False,
                Reason.NOT_EXPIRED,
                f"expires at {expiry.isoformat()}",
                now,
            )
    running = phase == "Running"
    status = SandboxSessionStatus(
        phase=phase,
        pod_name=None if stopped else pod.name,
        pod_ip=None if stopped else pod.ip,
        endpoint=f"http://{pod.ip}:{RUNTIME_PORT}" if running and pod.ip else None,
        conditions=ordered(conds),
        last_activity_time=prev.last_activity_time,
        started_at=None if stopped else (pod.started_at or None),
        started_from=None if stopped else pod.started_from,
        expires_at=expiry,
        observed_generation=prev.observed_generation if restart_required else session.generation,
    )
    if status.pod_name is None:
        return status  # no pod: no path
    same_start = (status.pod_name, status.started_at) == (prev.pod_name, prev.started_at)
    path = workspace_path or (prev.workspace_path if same_start else None)
    return status.model_copy(update={"workspace_path": path}) if path else status


def confined_condition(report: Mapping[str, Any] | None) -> tuple[bool, str, str] | None:
    """The ``Confined`` condition (status, reason, message) from the runtime's
    confinement report (``GET /v1/stats``); None when the runtime reports none."""
    if not report:
        return None
    if report.get("confined"):
        abi, network = report.get("landlock_abi", 0), report.get("network", "")
        features = ", ".join(report.get("features") or [])
        return True, Reason.LANDLOCK, f"Landlock ABI {abi}; network {network}; {features}".strip()
    reason = str(report.get("reason") or "")
    if report.get("mode") == "none":
        return False, Reason.CONFINEMENT_DISABLED, reason or "confinement is turned off (mode none)"
    return False, Reason.LANDLOCK_UNAVAILABLE, reason or "the kernel offers no Landlock"


_ORDER = {
    ConditionType.READY: 0,
    ConditionType.STOPPED: 1,
    ConditionType.EXPIRED: 2,
    ConditionType.CONFINED: 3,
    ConditionType.RESTART_REQUIRED: 4,
}


def ordered(conds: list[Condition]) -> list[Condition]:
    """Conditions in their fixed order (Ready, Stopped, Expired, Confined, …): a status
    written in this order is not rewritten for its order alone."""
    return sorted(conds, key=lambda c: (_ORDER.get(c.type, 9), c.type))
