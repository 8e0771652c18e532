"""The Secret and claim of one session incarnation (see ``handlers/sessions.py``).

Contract: ``ensure_children`` creates what is missing, owned by the session; a child of
an earlier incarnation (judged by owner uid, ``children.judge``) is never reused: an
old Secret is deleted (uid precondition) and awaited, an old claim is left to the
garbage collector and awaited, a terminating one awaited, and a claim without any owner
(``--cascade=orphan``) is adopted. The answer says what blocks a pod, if anything.
"""

from __future__ import annotations

import asyncio
import secrets

import kopf

from sandbox_workspace.contract.conditions import Reason
from sandbox_workspace.kube import core_path

from .. import naming
from ..builders import build_runtime_secret, build_workspace_pvc, needs_claim
from ..children import judge, owner_reference, uid_of
from ..context import OperatorContext
from ..models import SandboxSession
from ..status import PodState

# The Ready reason of a session waiting for an earlier incarnation's children to go.
OLD = Reason.OLD_INCARNATION


def _new(session: SandboxSession) -> bool:
    """Never reconciled yet (no status): its children are most likely absent, so they are
    created without a read first (a name taken answers 409, then the one there is judged)
    — one round trip less per child in a burst of new sessions."""
    return session.status.phase is None


async def _ensure_secret(ctx: OperatorContext, session: SandboxSession, body: dict) -> str | None:
    """The session's token Secret, or why we wait for it."""
    ns = session.namespace
    path = core_path(
        ns, "secrets", naming.runtime_secret_name(session.name, legacy=session.legacy_children)
    )
    secret = None if _new(session) else await ctx.api.get(path)
    state = judge(secret, session.uid)
    if state == "absent":
        token = secrets.token_urlsafe(32)
        manifest = build_runtime_secret(session, token)
        kopf.adopt(manifest, owner=body)
        if await ctx.api.create(core_path(ns, "secrets"), manifest) is not None:
            # A pool claim hands it over next: no read back of what we just wrote.
            ctx.remember_token(session.uid, token)
            return None
        secret = await ctx.api.get(path)  # there already: judge the one there
        state = judge(secret, session.uid)
    if state in ("absent", "ours"):  # absent: gone again since the 409 (as before)
        return None
    assert secret is not None
    if state != "terminating":
        await ctx.api.delete(path, uid=uid_of(secret))
    return "waiting for the token Secret of a previous incarnation to go"


async def _ensure_claim(ctx: OperatorContext, session: SandboxSession, body: dict) -> str | None:
    """The session's workspace claim, or why we wait for it."""
    ns = session.namespace
    name = naming.workspace_claim_name(session.name, legacy=session.legacy_children)
    path = core_path(ns, "persistentvolumeclaims", name)
    claim = None if _new(session) else await ctx.api.get(path)
    state = judge(claim, session.uid)
    if state == "absent":
        manifest = build_workspace_pvc(session)
        kopf.adopt(manifest, owner=body)
        if await ctx.api.create(core_path(ns, "persistentvolumeclaims"), manifest) is not None:
            return None
        claim = await ctx.api.get(path)  # there already: judge the one there
        state = judge(claim, session.uid)
        if state == "absent":
            return None  # gone again since the 409 (as before)
    if state == "ours":
        if ((claim or {}).get("status") or {}).get("phase") == "Lost":
            raise _ClaimLost(
                f"claim {name} lost its PersistentVolume: the workspace files are gone; "
                "delete the session to start over with a new claim"
            )
        return None
    if state == "orphaned":
        # Left by `--cascade=orphan`: the user's files, kept on purpose; the session they
        # were made for (same name, same user) takes them back.
        await ctx.api.patch(path, {"metadata": {"ownerReferences": [owner_reference(body)]}})
        kopf.event(
            body, type="Normal", reason=Reason.CLAIM_ADOPTED, message=f"adopted claim {name}"
        )
        return None
    if state == "terminating":
        return f"waiting for claim {name} of a previous incarnation to be deleted"
    return f"waiting for the garbage collector to delete claim {name} of a previous incarnation"


class _ClaimLost(Exception):
    """The session's own claim is Lost (its volume is gone); the message says so."""


async def ensure_children(
    ctx: OperatorContext, session: SandboxSession, body: dict, *, trust_cache: bool
) -> PodState | None:
    """Secret and claim (persistent, store mode local) of this incarnation; None when both
    are there, else what blocks a pod: an old incarnation's child to wait for (reason
    ``OldIncarnation``), or a lost claim (``ClaimLost``: reported, never replaced — that
    is a data decision)."""
    if trust_cache and session.uid in ctx.children_seen:
        return None  # verified for this incarnation; owner refs keep them
    # Independent objects: made side by side, one API round trip less on every start.
    ensure = [_ensure_secret(ctx, session, body)]
    if needs_claim(session, ctx.settings):  # none in store mode s3: the bucket holds the files
        ensure.append(_ensure_claim(ctx, session, body))
    results = await asyncio.gather(*ensure, return_exceptions=True)
    for result in results:
        if isinstance(result, _ClaimLost):
            return PodState("broken", Reason.CLAIM_LOST, str(result))
        if isinstance(result, BaseException):
            raise result
    # The claim's reason to wait first (as before), then the Secret's.
    waiting = next((r for r in reversed(results) if r), None)
    if waiting is None and session.uid:
        ctx.children_seen.add(session.uid)
    return None if waiting is None else PodState("pending", OLD, waiting)
