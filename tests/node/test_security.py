"""The sandbox's isolation on a real pod: Pod Security `restricted` admits what the
operator makes (and refuses what it must), the NetworkPolicy's shape, and what executed
code finds inside the container (uid, capabilities, seccomp, read-only root, Landlock)."""

from __future__ import annotations

import json

import httpx
import pytest
from hostile_code import run_hostile_suite
from kubeenv.client import ApiError
from nodeenv.release import NAMESPACE, RELEASE, SESSIONS

pytestmark = pytest.mark.node

# Run inside the sandbox: what the process is allowed, as JSON.
PROBE = r"""
import ctypes, json, os
status = dict(l.split(":", 1) for l in open("/proc/self/status").read().splitlines() if ":" in l)
libc = ctypes.CDLL(None, use_errno=True)
# landlock_create_ruleset(NULL, 0, LANDLOCK_CREATE_RULESET_VERSION) -> the ABI version
abi = libc.syscall(444, None, 0, 1)
try:
    open("/usr/evil", "w"); root_writable = True
except OSError as e:
    root_writable = e.errno != 30  # EROFS
print(json.dumps({
    "uid": os.getuid(), "gid": os.getgid(), "groups": os.getgroups(),
    "cap_eff": status["CapEff"].strip(), "cap_bnd": status["CapBnd"].strip(),
    "no_new_privs": status["NoNewPrivs"].strip(), "seccomp": status["Seccomp"].strip(),
    "landlock_abi": abi, "root_writable": root_writable,
}))
"""


def test_restricted_pod_security_admits_every_operator_pod_and_refuses_others(session, kube):
    session.execute("print(1)")  # the session's pod exists and runs
    ns = kube.get(f"/api/v1/namespaces/{SESSIONS}")
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    # Pods of sessions deleted by earlier tests may still be terminating (Succeeded).
    pods = [
        p
        for p in kube.list(f"/api/v1/namespaces/{SESSIONS}/pods")
        if not p["metadata"].get("deletionTimestamp")
    ]
    assert pods and all(p["status"]["phase"] in ("Running", "Pending") for p in pods)
    # Every pod the operator made was admitted; re-submitting each (dry run) to the
    # admission chain proves it meets `restricted` now, not only when it was made.
    for pod in pods:
        clean = {
            "apiVersion": "v1",
            "kind": "Pod",
            "spec": pod["spec"],
            "metadata": {"generateName": "psa-check-", "labels": pod["metadata"].get("labels", {})},
        }
        clean["spec"] = {k: v for k, v in pod["spec"].items() if k != "nodeName"}
        kube.create(f"/api/v1/namespaces/{SESSIONS}/pods", clean, dryRun="All")
    # And the namespace does enforce: a pod with privilege escalation is refused.
    bad = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "escalates"},
        "spec": {"containers": [{"name": "c", "image": "x"}]},
    }
    with pytest.raises(ApiError) as refused:
        kube.create(f"/api/v1/namespaces/{SESSIONS}/pods", bad, dryRun="All")
    assert refused.value.status == 403 and "restricted" in str(refused.value)


def test_network_policy_has_the_documented_shape(release, kube):
    (policy,) = kube.list(f"/apis/networking.k8s.io/v1/namespaces/{SESSIONS}/networkpolicies")
    spec = policy["spec"]
    assert spec["podSelector"] == {"matchLabels": {"sandboxworkspace.io/component": "runtime"}}
    assert sorted(spec["policyTypes"]) == ["Egress", "Ingress"]
    assert not spec.get("egress"), "no egress unless egressCIDRs are configured"
    (rule,) = spec["ingress"]
    assert rule["ports"] == [{"port": 8080, "protocol": "TCP"}]
    (peer,) = rule["from"]
    assert peer["namespaceSelector"] == {"matchLabels": {"kubernetes.io/metadata.name": NAMESPACE}}
    exprs = {e["key"]: e["values"] for e in peer["podSelector"]["matchExpressions"]}
    assert exprs["app.kubernetes.io/instance"] == [RELEASE]
    assert sorted(exprs["app.kubernetes.io/component"]) == ["api", "operator"]
    # The policy selects what the operator makes: the sandbox pods carry that label.
    pods = kube.list(
        f"/api/v1/namespaces/{SESSIONS}/pods",
        labelSelector="sandboxworkspace.io/component=runtime",
    )
    assert pods == [] or all(p["metadata"]["labels"] for p in pods)


def test_executed_code_is_confined_inside_the_pod(session):
    out = session.execute(PROBE)
    assert out["exit_code"] == 0, out
    seen = json.loads(out["stdout"])
    assert seen["uid"] == 10001 and seen["gid"] == 10001
    assert seen["cap_eff"] == "0000000000000000" and seen["cap_bnd"] == "0000000000000000"
    assert seen["no_new_privs"] == "1"
    assert seen["seccomp"] == "2"  # filter mode: RuntimeDefault
    assert seen["root_writable"] is False
    assert seen["landlock_abi"] >= 1, "Landlock must be available inside the container"


def test_hostile_code_catalogue_finds_no_leak_inside_a_real_pod(session, release):
    """The confinement suite (tests/support/hostile_code.py) played through the API pod
    against a sandbox pod: every attack refused, the sandbox healthy afterwards."""
    session.execute("print(1)")  # the pod runs before the catalogue starts
    with httpx.Client(
        base_url=release.api_url, headers=session.api.headers, timeout=240, trust_env=False
    ) as client:
        run_hostile_suite(client, f"/api/v1{session.url}")
