"""What the tier's cluster looked like when a node test failed (test helper), for the
failure report: the sessions' phases and Ready conditions, the pods, the latest events
and the tails of the operator's and the API's logs.

The report is what outlives a failed run: a pod's log goes with the pod (an upgrade or a
rollback replaces the operator's and the API's), and a run's directory with the next
runs (pytest keeps three). ``cluster_state`` never raises: each part that cannot be read
says why in its place (an apiserver that does not answer ends the look), and the whole
is bounded (``LIMIT`` characters).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
from kubeenv.client import KubeClient

from sandbox_workspace.contract.crd import API_VERSION, SESSION_PLURAL

from .release import NAMESPACE, SESSIONS

LIMIT = 24000
EVENTS = 30  # the latest events of each namespace
LINES = 40  # the last log lines of each operator and API container
WIDTH = 400  # characters kept of each log line (JSON records run long)
COMPONENTS = ("operator", "api")


def cluster_state(kube: KubeClient) -> str:
    parts: list[tuple[str, Callable[[KubeClient], list[str]]]] = [
        ("sessions", _sessions),
        ("pods", _pods),
        ("events", _events),
        ("logs", _logs),
    ]
    out: list[str] = []
    for title, part in parts:
        out.append(f"--- {title} ---")
        try:
            out.extend(part(kube))
        except httpx.TransportError as e:  # no apiserver: the other parts would wait too
            out.append(f"(the apiserver does not answer: {type(e).__name__}: {e})")
            break
        except Exception as e:  # a diagnosis must not hide the failure it explains
            out.append(f"(not read: {type(e).__name__}: {e})")
    text = "\n".join(out)
    return text if len(text) <= LIMIT else text[:LIMIT] + "\n(cut)"


def _sessions(kube: KubeClient) -> list[str]:
    lines = []
    for s in kube.list(f"/apis/{API_VERSION}/namespaces/{SESSIONS}/{SESSION_PLURAL}"):
        status = s.get("status") or {}
        ready = next((c for c in status.get("conditions") or [] if c.get("type") == "Ready"), {})
        gone = " (deleting)" if s["metadata"].get("deletionTimestamp") else ""
        lines.append(
            f"{s['metadata']['name']}{gone}: {status.get('phase')} "
            f"{ready.get('reason')} {ready.get('lastTransitionTime')}: {ready.get('message')}"
        )
    return lines or ["(none)"]


def _pods(kube: KubeClient) -> list[str]:
    lines = []
    for ns in (NAMESPACE, SESSIONS):
        for p in kube.list(f"/api/v1/namespaces/{ns}/pods"):
            lines.append(f"{ns}/{p['metadata']['name']}: {_pod_state(p)}")
    return lines or ["(none)"]


def _pod_state(pod: dict[str, Any]) -> str:
    status = pod.get("status") or {}
    words = [str(status.get("phase")), f"node={pod['spec'].get('nodeName')}"]
    if pod["metadata"].get("deletionTimestamp"):
        words.append("deleting")
    for c in status.get("conditions") or []:
        if c.get("status") != "True" and c.get("reason"):
            words.append(f"{c['type']}={c['reason']}: {c.get('message', '')}")
    for c in status.get("containerStatuses") or []:
        state = next(iter(c.get("state") or {}), "?")
        detail = (c.get("state") or {}).get(state) or {}
        words.append(
            f"{c['name']} {state} {detail.get('reason', '')} ready={c.get('ready')} "
            f"restarts={c.get('restartCount')}"
        )
    return " ".join(words)


def _events(kube: KubeClient) -> list[str]:
    lines = []
    for ns in (NAMESPACE, SESSIONS):
        events = kube.list(f"/api/v1/namespaces/{ns}/events")
        events.sort(key=_when)
        for e in events[-EVENTS:]:
            obj = e.get("involvedObject") or {}
            lines.append(
                f"{_when(e)} {ns} {e.get('type')} {e.get('reason')} "
                f"{obj.get('kind')}/{obj.get('name')}: {e.get('message', '').strip()}"
            )
    return lines or ["(none)"]


def _when(event: dict[str, Any]) -> str:
    return str(
        event.get("lastTimestamp")
        or event.get("eventTime")
        or event.get("firstTimestamp")
        or event["metadata"].get("creationTimestamp")
        or ""
    )


def _logs(kube: KubeClient) -> list[str]:
    lines = []
    for component in COMPONENTS:
        pods = kube.list(
            f"/api/v1/namespaces/{NAMESPACE}/pods",
            labelSelector=f"app.kubernetes.io/component={component}",
        )
        for p in pods:
            name = p["metadata"]["name"]
            restarted = any(
                c.get("restartCount") for c in p["status"].get("containerStatuses") or []
            )
            for previous in (True, False) if restarted else (False,):
                which = " (previous container)" if previous else ""
                lines.append(f"- {name}{which}:")
                try:
                    text = kube.get(
                        f"/api/v1/namespaces/{NAMESPACE}/pods/{name}/log",
                        tailLines=LINES,
                        previous=str(previous).lower(),
                    )
                except Exception as e:
                    text = f"(not read: {e})"
                lines.extend(line[:WIDTH] for line in str(text or "").splitlines()[-LINES:])
    return lines or ["(none)"]
