"""Spans of the operator's work (sandbox_workspace/tracing.py; nothing when tracing is off).

Contract: one span per reconcile, named ``operator.reconcile`` (a SandboxSession),
``operator.workspace`` (a ConversationWorkspace made ready), ``operator.delete_files``
(its finalizer) or ``operator.deadline`` (a due look), with the object and what triggered
it as attributes. Only the change the API itself wrote — a creation, a resume request —
continues the API's trace: its span is the child of the traceparent the API put in the
object's annotation. Everything else (pod events, deadlines, an operator restart's
resume, retries of other causes) starts a trace of its own, so an old annotation never
gathers a session's whole life into one trace.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from sandbox_workspace import tracing
from sandbox_workspace.contract.crd import ANNOTATION_TRACEPARENT

# Triggers the API's own writes cause (kopf's reason "create", our resume request).
CONTINUES_THE_API = frozenset({"create", "resume-requested"})


def span(
    name: str,
    kind: str,
    namespace: str,
    obj: str,
    trigger: str,
    annotations: Mapping[str, str] | None = None,
) -> contextlib.AbstractContextManager[Any]:
    attributes = {
        "k8s.namespace.name": namespace,
        "sandboxworkspace.kind": kind,
        "sandboxworkspace.name": obj,
        "sandboxworkspace.trigger": trigger,
    }
    return tracing.span(name, attributes, parent=parent_of(trigger, annotations))


def parent_of(trigger: str, annotations: Mapping[str, str] | None) -> str | None:
    """The API's traceparent when this trigger is the API's own write, else None."""
    if trigger not in CONTINUES_THE_API or not annotations:
        return None
    return annotations.get(ANNOTATION_TRACEPARENT)


def traced(
    name: str, kind: str
) -> Callable[[Callable[..., Awaitable[Any]]], Callable[..., Awaitable[Any]]]:
    """A kopf resource handler inside ``span`` (its id stays the handler's own: kopf
    follows ``__wrapped__``)."""

    def wrap(handler: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        @functools.wraps(handler)
        async def traced_handler(**kwargs: Any) -> Any:
            trigger = str(kwargs.get("reason") or "event")
            with span(
                name,
                kind,
                kwargs.get("namespace") or "",
                kwargs.get("name") or "",
                trigger,
                kwargs.get("annotations"),
            ):
                return await handler(**kwargs)

        return traced_handler

    return wrap
