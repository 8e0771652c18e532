"""Pure rules and builders of the warm pool (issue 25). No I/O.

Contract:
- ``build_pool_pod`` makes a pool member with the *same* builder as a session's pod
  (``builders._runtime_pod``), from a stand-in session with the default spec: same image,
  resources, confinement, security context, volumes. It differs only in what makes it
  nobody's: no session or user label, no user annotation, no owner, a generated name,
  and instead of a token its runtime gets the namespace's claim key (``POOL_SECRET``),
  so it starts pooled (``runtime/claim.py``), and the key's digest (``key_id``) as an
  annotation: a free pod of another key is stale (the key was rotated: the Secret
  deleted or changed), as is one of another template. Where the cluster has an egress CA, it
  mounts the CA's ConfigMap (optional: a pool is not held up by a proxy that has not
  published it yet) so a session with an egress policy may take it too.
- ``claim_egress`` is what the claim tells the runtime of such a session: network
  ``proxy_port`` and its code's environment (``builders.code_network``); None for any
  other session (its code keeps the pooled runtime's network, denied).
- ``misfits`` is THE eligibility rule: the spec fields of a session that a pooled pod
  cannot give; empty means the session may take a pooled pod. One line per field.
- ``claim_patch`` is the compare-and-swap that moves a free pod to a session: labels,
  user annotation, owner reference and spec digest in one merge patch carrying the
  pod's ``resourceVersion`` (the apiserver refuses it with 409 if the pod changed since).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

from sandbox_workspace.contract.crd import (
    ANNOTATION_CLAIM_KEY_ID,
    ANNOTATION_POD_SPEC,
    ANNOTATION_USER_ID,
    LABEL_POOL,
    LABEL_SESSION,
    LABEL_USER,
)
from sandbox_workspace.runtime.settings import RuntimeSettings

from .. import naming
from ..builders import _runtime_pod, build_sandbox_pod, code_network, mount_egress_ca, spec_hash
from ..children import owner_reference
from ..models import SandboxSession, SandboxSessionSpec
from ..settings import OperatorSettings

# ``LABEL_POOL`` is on every pool member for its whole life: "free", then "claimed".
FREE, CLAIMED = "free", "claimed"
POOL_SECRET = "sandbox-pool-claim"  # per namespace: the claim key of its pool's runtimes
CLAIM_KEY = "key"
CLAIM_ENV = RuntimeSettings.env_name("claim_key")
POD_PREFIX = "sbx-pool-"

# The spec a pool member is built from: the defaults, without a volume of its own.
_DEFAULT = SandboxSessionSpec.model_validate({"userId": "pool", "storage": {"persistent": False}})
_Rule = Callable[[SandboxSessionSpec, OperatorSettings], bool]

# What a pooled pod cannot give: (field, rule true when the session asks for it). A pooled
# pod has no volume of a user: a persistent session needs its claim — except in store mode
# `s3`, where no session has one (the bucket keeps the files, builders.needs_claim).
# Limits per execution reach the runtime as its environment at start: only the defaults.
RULES: tuple[tuple[str, _Rule], ...] = (
    ("storage.persistent", lambda s, cfg: s.storage.persistent and cfg.store != "s3"),
    ("limits", lambda s, _: s.limits != _DEFAULT.limits),
    ("storage.size", lambda s, _: s.storage.size != _DEFAULT.storage.size),
    ("image", lambda s, cfg: s.image not in (None, cfg.image)),
    ("resources", lambda s, _: s.resources is not None),
    ("network", lambda s, _: s.network != _DEFAULT.network),
    # An egress policy needs no rule: its network and code environment come with the
    # claim (``claim_egress``), the CA bundle is mounted on every pool member.
    ("fileUploadConfig", lambda s, _: s.file_upload_config != _DEFAULT.file_upload_config),
)


def misfits(spec: SandboxSessionSpec, settings: OperatorSettings) -> list[str]:
    """The fields of ``spec`` a pooled pod cannot give (empty: it may take one)."""
    return [field for field, asks in RULES if asks(spec, settings)]


def _stand_in(namespace: str) -> SandboxSession:
    return SandboxSession(name="pool", namespace=namespace, spec=_DEFAULT)


def key_id(key: str) -> str:
    """The digest of a claim key a pool pod is labelled with (the key is 256 random bits:
    its digest tells nothing of it)."""
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def build_pool_pod(namespace: str, settings: OperatorSettings, key: str = "") -> dict[str, Any]:
    """A pool member for ``namespace`` whose runtime takes claims with ``key`` (see the
    module contract)."""
    pod = _runtime_pod(_stand_in(namespace), settings, secret=POOL_SECRET)
    meta = pod["metadata"]
    del meta["name"]
    meta["generateName"] = POD_PREFIX
    meta["labels"].pop(LABEL_SESSION)
    meta["labels"].pop(LABEL_USER)
    meta["labels"][LABEL_POOL] = FREE
    env = pod["spec"]["containers"][0]["env"]
    token = next(e for e in env if e["name"] == RuntimeSettings.env_name("token"))
    token["name"] = CLAIM_ENV
    token["valueFrom"]["secretKeyRef"]["key"] = CLAIM_KEY
    if settings.egress_ca_configmap:
        mount_egress_ca(pod["spec"], settings.egress_ca_configmap, optional=True)
    meta["annotations"] = {
        ANNOTATION_POD_SPEC: spec_hash(pod),
        ANNOTATION_CLAIM_KEY_ID: key_id(key),
    }
    return pod


def claim_egress(session: SandboxSession, settings: OperatorSettings) -> dict[str, Any] | None:
    """The ``egress`` of the claim for ``session`` (``runtime/claim.ClaimEgress``)."""
    network = code_network(session, settings)
    if network["network"] != "proxy_port":
        return None
    return {"proxy_port": network["egress_proxy_port"], "code_env": network["code_env"]}


def template_hash(namespace: str, settings: OperatorSettings) -> str:
    """Digest of today's pool member: a free pod with another digest is stale."""
    return build_pool_pod(namespace, settings)["metadata"]["annotations"][ANNOTATION_POD_SPEC]


def build_pool_secret(key: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": POOL_SECRET,
            "labels": {
                "app.kubernetes.io/name": "sandbox-workspace",
                "app.kubernetes.io/managed-by": "sandbox-workspace-operator",
            },
        },
        "type": "Opaque",
        "stringData": {CLAIM_KEY: key},
    }


def is_free(pod: dict[str, Any], template: str, key: str) -> bool:
    """A free, current (today's ``template``, started with the claim ``key``), not
    terminating pool member (ready or not)."""
    meta = pod.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    return (
        (meta.get("labels") or {}).get(LABEL_POOL) == FREE
        and not meta.get("deletionTimestamp")
        and annotations.get(ANNOTATION_POD_SPEC) == template
        and annotations.get(ANNOTATION_CLAIM_KEY_ID) == key_id(key)
    )


def claim_patch(
    pod: dict[str, Any], session: SandboxSession, body: dict[str, Any], settings: OperatorSettings
) -> dict[str, Any]:
    """The compare-and-swap moving free ``pod`` to ``session`` (``body``: as read).

    The spec digest becomes the one of the session's own pod: the claimed pod serves the
    session's spec (``misfits`` was empty), so a later spec change rolls it like any pod."""
    desired = build_sandbox_pod(session, settings)["metadata"]["annotations"][ANNOTATION_POD_SPEC]
    return {
        "metadata": {
            "resourceVersion": pod["metadata"]["resourceVersion"],
            "labels": {
                LABEL_POOL: CLAIMED,
                LABEL_SESSION: session.name,
                LABEL_USER: naming.dns_name(session.spec.user_id),
            },
            "annotations": {
                ANNOTATION_USER_ID: session.spec.user_id,
                ANNOTATION_POD_SPEC: desired,
            },
            "ownerReferences": [owner_reference(body)],
        }
    }
