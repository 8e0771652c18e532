"""Operator-wide kopf settings, login and the metrics server.

Each kopf setting says why it is set. Peering (more than one replica): with
``SANDBOX_OPERATOR_STANDALONE=false`` the replicas find each other through a
``KopfPeering`` object named ``SANDBOX_OPERATOR_PEERING_NAME`` (kopf's peering CRDs must
be installed; the chart does it) and only the replica with the highest
``SANDBOX_OPERATOR_PRIORITY`` handles resources while the others wait — a hot standby,
not sharding. With the default (standalone) run exactly one replica
(Deployment ``replicas: 1``, ``strategy: Recreate``).
"""

from __future__ import annotations

import logging
from functools import partial
from typing import Any

import kopf

from sandbox_workspace.contract.crd import (
    API_VERSION,
    COMPONENT_RUNTIME,
    FINALIZER_FILES,
    LABEL_COMPONENT,
    PREFIX,
    SESSION_PLURAL,
    WORKSPACE_PLURAL,
)

from ..context import OperatorContext
from ..deadlines import Deadlines
from ..diffbase import SessionDiffBaseStorage, SessionProgressStorage
from ..discovery import wait_until_served
from ..peering import PEERING_GROUP, Activity
from . import checks


async def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    ctx: OperatorContext = memo.ctx
    ours = ctx.settings
    # Our finalizer: on a ConversationWorkspace it is the files' guarantee (sessions have
    # no deletion handler, timer or daemon, so kopf puts none on them).
    settings.persistence.finalizer = FINALIZER_FILES
    # kopf's bookkeeping in annotations under our prefix, never in our status (which the
    # CRD schema defines and the API reads) — and none for a new session the warm pool's
    # short path started (its status says it was handled: diffbase.py).
    progress = settings.persistence.progress_storage = SessionProgressStorage(
        prefix=PREFIX, started=lambda uid: ctx.pool is not None and ctx.pool.started(uid)
    )
    settings.persistence.diffbase_storage = SessionDiffBaseStorage(
        prefix=PREFIX,
        skip=lambda uid: ctx.pool is not None and ctx.pool.unrecorded(uid),
        progress=progress,
    )
    # Watches end server-side after this and reconnect, so a silently dead connection
    # (load balancer, apiserver restart) cannot leave the operator deaf for long.
    settings.watching.server_timeout = ours.watch_server_timeout_seconds
    settings.watching.client_timeout = ours.watch_server_timeout_seconds + 30
    settings.watching.connect_timeout = 10
    # Only sandbox pods interest us: filter server-side instead of watching every pod.
    settings.watching.label_selectors["v1", "pods"] = f"{LABEL_COMPONENT}={COMPONENT_RUNTIME}"
    # kopf would turn every handler log line into a Kubernetes Event; we post our own on
    # transitions, so only warnings and errors become Events.
    settings.posting.level = logging.WARNING
    # kopf logs "Handler 'x' succeeded." at INFO for every event handler on every watch
    # event (two lines per pod event): 7% of the operator's CPU in a burst of 50 claims
    # (py-spy), and noise. Kept: change handlers' lines, and every warning and error.
    logging.getLogger("kopf.objects").addFilter(_quiet_event_handlers)
    settings.posting.reporting_component = "sandbox-workspace-operator"
    # Errors that are not TemporaryError (bugs, surprises) are retried too, not fast.
    settings.execution.default_backoff = ours.retry_max_delay_seconds
    # A killed replica's standby takes over once its keep-alive is this old (kopf's
    # default, 60 s, is a minute with nothing reconciled).
    settings.peering.lifetime = ours.peering_lifetime_seconds
    await ctx.start()
    # kopf reads the apiserver's discovery once, right after this handler: an apiserver
    # still starting would leave the operator serving nothing (discovery.py says why).
    await wait_until_served(ctx.api, served_resources(ours.standalone, not ours.namespaces))
    ctx.activity = Activity(
        ctx.api,
        standalone=ours.standalone,
        clusterwide=not ours.namespaces,
        name=ours.peering_name,
        identity=ctx.identity,
        priority=ours.priority,
    )
    # Every session's next deadline, in one scheduler (checks.py: the contract); started
    # by the first session event, inside kopf's context (kopf.event needs its queue).
    ctx.deadlines = Deadlines(partial(checks.on_deadline, ctx), concurrency=ours.check_concurrency)
    if ours.metrics_port:
        ctx.metrics.serve(ours.metrics_port, ours.metrics_host)


def served_resources(standalone: bool, clusterwide: bool) -> dict[str, tuple[str, ...]]:
    """The custom resources kopf must find in discovery (pods are built in)."""
    wanted = {API_VERSION: (SESSION_PLURAL, WORKSPACE_PLURAL)}
    if not standalone:
        wanted[PEERING_GROUP] = ("clusterkopfpeerings",) if clusterwide else ("kopfpeerings",)
    return wanted


def _quiet_event_handlers(record: logging.LogRecord) -> bool:
    """False for an event handler's routine success line (kopf's local object logger
    marks them ``k8s_skip``); a logging filter, installed once per process."""
    routine = record.levelno <= logging.INFO and getattr(record, "k8s_skip", False)
    return not (routine and str(record.msg).endswith(" succeeded."))


def login(memo: kopf.Memo, **_: Any) -> kopf.ConnectionInfo:
    """The same cluster our own client talks to (kubeconfig or service account)."""
    ctx: OperatorContext = memo.ctx
    return ctx.ensure_credentials().connection_info()


async def cleanup(memo: kopf.Memo, **_: Any) -> None:
    ctx: OperatorContext = memo.ctx
    await ctx.aclose()
