"""kopf handlers, registered into a registry of their own by ``build_registry``.

Registering explicitly (instead of decorating at import) lets each operator run — a
test, a second replica in one process — get its own registry, with intervals taken
from its settings.
"""

from __future__ import annotations

import kopf

from sandbox_workspace.contract.crd import GROUP, SESSION_PLURAL, VERSION, WORKSPACE_PLURAL

from ..diffbase import RECONCILE
from ..pool import LABEL_POOL
from ..pool import refill as pool
from ..settings import OperatorSettings
from . import deletion, pool_start, sessions, startup, workspaces
from .traced import traced

SESSIONS = (GROUP, VERSION, SESSION_PLURAL)
WORKSPACES = (GROUP, VERSION, WORKSPACE_PLURAL)
PODS = ("v1", "pods")


def build_registry(settings: OperatorSettings) -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()
    on = kopf.on

    on.startup(registry=registry)(startup.configure)
    on.login(registry=registry)(startup.login)
    on.cleanup(registry=registry)(startup.cleanup)
    # The warm pool (operator/pool): its refiller, and its pods' events.
    on.startup(registry=registry)(pool.start)
    on.cleanup(registry=registry)(pool.stop)
    on.event(*PODS, labels={LABEL_POOL: kopf.PRESENT}, registry=registry)(pool.on_pool_pod_event)

    # Spans (handlers/traced.py): a creation continues the API's trace. A start the warm
    # pool can serve takes its short path (pool_start.py), the rest sessions.py's handlers.
    on_session_changed = traced("operator.reconcile", "SandboxSession")(
        pool_start.on_session_changed
    )
    for decorator in (on.create, on.resume):
        decorator(*SESSIONS, registry=registry, id=RECONCILE)(on_session_changed)
    on.update(*SESSIONS, field="spec", registry=registry, id=RECONCILE)(on_session_changed)
    on.event(*SESSIONS, registry=registry)(pool_start.on_session_event)
    on.event(*PODS, registry=registry)(sessions.on_runtime_pod_event)
    # No timer per session: deadlines (idle, TTL, rolls) live in one scheduler fed by the
    # session events above (checks.py), so an operator at rest does nothing.

    workspace = "ConversationWorkspace"
    on_workspace_created = traced("operator.workspace", workspace)(workspaces.on_workspace_created)
    for decorator in (on.create, on.resume):
        decorator(*WORKSPACES, registry=registry, id="ensure", retries=None)(on_workspace_created)
    # retries=None: a deletion that guards files is retried forever (STYLE 5).
    on.delete(*WORKSPACES, registry=registry, id="delete-files", retries=None)(
        traced("operator.delete_files", workspace)(deletion.on_workspace_deleted)
    )
    return registry
