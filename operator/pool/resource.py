"""The SandboxPool custom resource: what ``kubectl get sandboxpools`` shows of a pool.

Contract: one SandboxPool named ``default`` per pool namespace, created by the operator's
refiller (create-if-absent) and never by anyone else; its status — size, ready,
claimed — is written by the active operator replica from its pool state
(``refill.report``) whenever a count changes. The pool's settings stay where they are
(chart values ``sandbox.pool.*`` → the operator's settings): the spec is empty, the
resource only reports. Deleting it is harmless: the next refill round makes it again.
Pure models and builders; no I/O.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from sandbox_workspace.contract.crd import API_VERSION

from ..models import CamelModel, StatusModel

POOL_KIND = "SandboxPool"
POOL_PLURAL = "sandboxpools"
POOL_NAME = "default"


class SandboxPoolSpec(CamelModel):
    """Empty: a pool is configured by the operator's settings (chart values sandbox.pool.*)."""


class SandboxPoolStatus(StatusModel):
    """The pool as the active operator replica counts it (written only by the operator)."""

    size: int = Field(0, description="Free ready pods the operator keeps (its setting).")
    ready: int = Field(0, description="Free pods whose runtime is ready: claimable now.")
    claimed: int = Field(0, description="Live pods claimed from this pool by sessions.")


def build_pool_resource() -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": POOL_KIND,
        "metadata": {
            "name": POOL_NAME,
            "labels": {"app.kubernetes.io/managed-by": "sandbox-workspace-operator"},
        },
        "spec": {},
    }


def status_patch(status: SandboxPoolStatus) -> dict[str, Any]:
    return {"status": status.model_dump(mode="json", by_alias=True)}
