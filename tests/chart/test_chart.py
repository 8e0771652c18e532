"""The Helm chart, statically: lint, render (defaults and a hardened values file),
kubeconform (strict, offline schemas incl. our CRDs from the models), secure defaults,
least-privilege RBAC, values documented and schema-checked, settings the processes accept.

The live half — the chart applied to a real apiserver and the operator and API run under
its ServiceAccounts — is tests/cluster/test_chart_rbac.py.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from charttools import CHART, HARDENED_VALUES, REPO, Tools, helm, kubeconform, render, render_text

from sandbox_workspace.api.settings import ApiSettings
from sandbox_workspace.operator import crdgen
from sandbox_workspace.operator.settings import OperatorSettings

RELEASE, NAMESPACE = "sw", "sandbox"
E2B_KEYS = "sandbox-workspace-e2b-keys"  # api/e2b/keys.py
VALUE_SETS = {"defaults": (), "hardened": (HARDENED_VALUES,)}


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def one(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = [d for d in by_kind(docs, kind) if d["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} found"
    return found[0]


def workloads(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] in ("Deployment", "StatefulSet")]


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


@pytest.fixture(scope="module", params=sorted(VALUE_SETS))
def rendered(request: pytest.FixtureRequest, tools: Tools) -> tuple[str, list[dict[str, Any]]]:
    values = VALUE_SETS[request.param]
    return request.param, render(tools, release=RELEASE, namespace=NAMESPACE, values=values)


# ---------------------------------------------------------------------------- CRDs
def test_chart_crds_are_the_generated_ones() -> None:
    """charts/.../crds/ holds exactly crds/*.yaml (rendered from the models) plus kopf's
    peering CRD; a stale copy fails here (fix: cp crds/*.yaml charts/sandbox-workspace/crds/)."""
    chart_crds = CHART / "crds"
    generated = crdgen.render_all()
    assert sorted(p.name for p in chart_crds.glob("*.yaml")) == sorted(
        [*generated, "kopf-peering.yaml"]
    )
    for name, text in generated.items():
        assert (chart_crds / name).read_text() == text, (
            f"charts/sandbox-workspace/crds/{name} is stale: run `sandbox-workspace crds "
            f"--output-dir charts/sandbox-workspace/crds`"
        )
        assert (REPO / "crds" / name).read_text() == text


# -------------------------------------------------------------------------- values
def test_every_values_key_has_a_comment() -> None:
    lines = (CHART / "values.yaml").read_text().splitlines()
    missing = []
    for i, line in enumerate(lines):
        if not re.match(r"^\s*[A-Za-z0-9_.-]+:", line):
            continue
        previous = next((p for p in reversed(lines[:i]) if p.strip()), "")
        if not previous.lstrip().startswith("#") and " # " not in line:
            missing.append(f"line {i + 1}: {line.strip()}")
    assert not missing, "values keys without a comment:\n" + "\n".join(missing)


def test_values_schema_covers_every_default_key() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    schema = json.loads((CHART / "values.schema.json").read_text())

    def walk(value: Any, node: dict[str, Any], path: str) -> None:
        if not isinstance(value, dict) or "properties" not in node:
            return
        for key, sub in value.items():
            assert key in node["properties"], f"{path}.{key} is not in values.schema.json"
            walk(sub, node["properties"][key], f"{path}.{key}")

    walk(values, schema, "values")


@pytest.mark.parametrize(
    ("key", "value", "complaint"),
    [
        pytest.param("sessions.fileUpload.maxFileSizeUnit", "TB", "maxFileSizeUnit", id="unit"),
        pytest.param("sesions.namespace", "x", "sesions", id="typo"),
        pytest.param("api.securityContext.allowPrivilegeEscalation", "true", "", id="escalation"),
        pytest.param("operator.podSecurityContext.runAsNonRoot", "false", "", id="root"),
        pytest.param("sessions.ttlSeconds", "10", "ttlSeconds", id="ttl"),
        pytest.param("sandbox.networkPolicy.egressCIDRs[0]", "anywhere", "", id="cidr"),
        pytest.param("chat.runStore", "etcd", "runStore", id="run-store"),
        pytest.param("egressProxy.port", "8080", "port", id="proxy-on-runtime-port"),
    ],
)
def test_values_schema_refuses_bad_values(tools: Tools, key: str, value: str, complaint: str):
    result = render_text(tools, set_values={key: value}, check=False)
    assert result.returncode != 0, f"--set {key}={value} was accepted"
    assert "values don't meet the specifications of the schema" in result.stderr
    assert complaint in result.stderr


# ---------------------------------------------------------------------- lint/render
@pytest.mark.parametrize("name", sorted(VALUE_SETS))
def test_helm_lint_strict(tools: Tools, name: str) -> None:
    args = ["lint", "--strict", str(CHART), "--namespace", NAMESPACE]
    for path in VALUE_SETS[name]:
        args += ["--values", str(path)]
    result = helm(tools, *args)
    assert "0 chart(s) failed" in result.stdout


def test_kubeconform_strict_accepts_the_rendered_chart(
    tools: Tools, schema_dir: Path, rendered: tuple[str, list[dict[str, Any]]], tmp_path: Path
) -> None:
    name, _ = rendered
    text = render_text(
        tools, release=RELEASE, namespace=NAMESPACE, values=VALUE_SETS[name], include_crds=True
    ).stdout
    manifests = tmp_path / f"{name}.yaml"
    manifests.write_text(text)
    report = kubeconform(tools, schema_dir, manifests)
    summary = report["summary"]
    docs = [d for d in yaml.safe_load_all(text) if d]
    assert summary["valid"] == len(docs) and summary["skipped"] == 0, summary


def test_kubeconform_validates_custom_resources_against_the_models(
    tools: Tools, schema_dir: Path, tmp_path: Path
) -> None:
    good = {
        "apiVersion": "sandboxworkspace.io/v1alpha1",
        "kind": "SandboxSession",
        "metadata": {"name": "sb-session-alice", "namespace": "s"},
        "spec": {
            "userId": "alice",
            "idleTimeoutSeconds": 600,
            "fileUploadConfig": {
                "maxFileSize": 10,
                "maxFileSizeUnit": "MB",
                "maxFileCount": 5,
                "allowedFileTypes": ["csv"],
            },
            "resources": {"limits": {"cpu": 1, "memory": "1Gi"}},
        },
    }
    workspace = {
        "apiVersion": "sandboxworkspace.io/v1alpha1",
        "kind": "ConversationWorkspace",
        "metadata": {"name": "cws-1", "namespace": "s"},
        "spec": {"conversationId": "conv-1", "sessionRef": "sb-session-alice"},
    }
    path = tmp_path / "good.yaml"
    path.write_text(yaml.safe_dump_all([good, workspace]))
    assert kubeconform(tools, schema_dir, path)["summary"]["valid"] == 2

    bad_cases = {
        "unknown field": {**good, "spec": {**good["spec"], "userID": "x"}},
        "wrong type": {**good, "spec": {**good["spec"], "idleTimeoutSeconds": "soon"}},
        "bad unit": {
            **good,
            "spec": {**good["spec"], "fileUploadConfig": {"maxFileSizeUnit": "TB"}},
        },
        "missing required": {**workspace, "spec": {"conversationId": "c"}},
    }
    for what, doc in bad_cases.items():
        path = tmp_path / "bad.yaml"
        path.write_text(yaml.safe_dump(doc))
        report = kubeconform(tools, schema_dir, path, check=False)
        assert report["summary"]["invalid"] == 1, f"{what} was accepted: {report}"


def test_kubeconform_is_strict_about_builtin_kinds(
    tools: Tools, schema_dir: Path, tmp_path: Path
) -> None:
    docs = render(tools, release=RELEASE, namespace=NAMESPACE)
    deployment = one(docs, "Deployment", f"{RELEASE}-sandbox-workspace-api")
    deployment["spec"]["template"]["spec"]["containers"][0]["securityContxt"] = {}
    path = tmp_path / "typo.yaml"
    path.write_text(yaml.safe_dump(deployment))
    report = kubeconform(tools, schema_dir, path, check=False)
    assert report["summary"]["invalid"] == 1, report


# ------------------------------------------------------------------ secure defaults
def test_every_pod_is_locked_down(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    name, docs = rendered
    # API and operator; the hardened values add the egress proxy.
    assert len(workloads(docs)) == (3 if name == "hardened" else 2)
    for workload in workloads(docs):
        pod = workload["spec"]["template"]["spec"]
        where = workload["metadata"]["name"]
        assert pod["securityContext"]["runAsNonRoot"] is True, where
        assert pod["securityContext"]["runAsUser"] == 10001, where
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}, where
        assert pod["enableServiceLinks"] is False, where
        assert pod.get("hostNetwork") is not True and pod.get("hostPID") is not True, where
        for container in pod["containers"]:
            ctx = container["securityContext"]
            assert ctx["allowPrivilegeEscalation"] is False, where
            assert ctx["readOnlyRootFilesystem"] is True, where
            assert ctx["capabilities"] == {"drop": ["ALL"]}, where
            assert ctx["runAsNonRoot"] is True, where
            assert "limits" in container["resources"], where
            probe = container["livenessProbe"]
            if "egress-proxy" in where:  # no HTTP of its own: its listener is probed
                assert probe["tcpSocket"] == {"port": "proxy"}, where
            else:
                assert probe["httpGet"]["path"] == "/healthz", where
            mounts = {m["mountPath"] for m in container["volumeMounts"]}
            # The egress CA's key: the proxy alone (test_egress_ca_key_is_the_proxys_alone).
            ca = {"/etc/sandbox-workspace/egress-ca"} if "egress-proxy" in where else set()
            assert mounts == {"/tmp"} | ca, where


def test_the_sessions_namespace_enforces_restricted_pods(
    rendered: tuple[str, list[dict[str, Any]]],
) -> None:
    name, docs = rendered
    ns = one(docs, "Namespace", "agent-sandboxes" if name == "hardened" else "sandbox-sessions")
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    assert ns["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"


def test_rbac_is_namespaced_and_minimal(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    name, docs = rendered
    sessions_ns = "agent-sandboxes" if name == "hardened" else "sandbox-sessions"
    # The cluster-scoped grants, read-only and for the operator only: kopf's discovery,
    # and the volumes the deletion finalizer checks for retained files.
    (cluster_role,) = by_kind(docs, "ClusterRole")
    assert cluster_role["rules"] == [
        {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["list", "watch"]},
        {
            "apiGroups": ["apiextensions.k8s.io"],
            "resources": ["customresourcedefinitions"],
            "verbs": ["list", "watch"],
        },
        {"apiGroups": [""], "resources": ["persistentvolumes"], "verbs": ["get", "list"]},
    ]
    (cluster_binding,) = by_kind(docs, "ClusterRoleBinding")
    assert cluster_binding["subjects"] == [
        {
            "kind": "ServiceAccount",
            "name": f"{RELEASE}-sandbox-workspace-operator",
            "namespace": NAMESPACE,
        }
    ]
    # The egress CA's hook Role lives only while the hook runs (test_egress_ca_hook_job).
    roles = {
        r["metadata"]["name"]: r
        for r in by_kind(docs, "Role")
        if "helm.sh/hook" not in r["metadata"].get("annotations", {})
    }
    assert set(roles) == {
        f"{RELEASE}-sandbox-workspace-api",
        f"{RELEASE}-sandbox-workspace-operator",
        # Read-only sessions and pods (test_egress_proxy_component).
        *([f"{RELEASE}-sandbox-workspace-egress-proxy"] if name == "hardened" else []),
    }
    for role in roles.values():
        assert role["metadata"]["namespace"] == sessions_ns
        for rule in role["rules"]:
            assert "*" not in rule["verbs"] and "*" not in rule["resources"]
            assert not {"escalate", "bind", "impersonate"} & set(rule["verbs"])

    def grants(role: dict[str, Any]) -> dict[str, set[str]]:
        out: dict[str, set[str]] = {}
        for rule in role["rules"]:
            for group in rule["apiGroups"]:
                for res in rule["resources"]:
                    out.setdefault(f"{group}/{res}", set()).update(rule["verbs"])
        return out

    api = grants(roles[f"{RELEASE}-sandbox-workspace-api"])
    assert api == {
        "sandboxworkspace.io/sandboxsessions": {"get", "watch", "create", "patch", "delete"},
        "sandboxworkspace.io/conversationworkspaces": {"get", "list", "watch", "create", "delete"},
        "/secrets": {"get", "patch"},  # patch: only the E2B key Secret, by name
    }
    [patching] = [
        r
        for r in roles[f"{RELEASE}-sandbox-workspace-api"]["rules"]
        if "patch" in r["verbs"] and r["resources"] == ["secrets"]
    ]
    assert patching["resourceNames"] == [E2B_KEYS]
    operator = grants(roles[f"{RELEASE}-sandbox-workspace-operator"])
    assert operator["/secrets"] == {"get", "create", "delete"}  # old incarnations' tokens
    assert operator["/persistentvolumeclaims"] == {"get", "create", "patch"}  # adoption
    assert operator["/pods"] == {"get", "list", "watch", "create", "delete", "patch"}
    assert "kopf.dev/kopfpeerings" in operator  # two peered replicas in every value set
    for binding in by_kind(docs, "RoleBinding") + by_kind(docs, "ClusterRoleBinding"):
        (subject,) = binding["subjects"]
        assert subject["kind"] == "ServiceAccount" and subject["namespace"] == NAMESPACE
        assert binding["roleRef"]["name"].startswith(subject["name"])
    for sa in by_kind(docs, "ServiceAccount"):
        assert sa["automountServiceAccountToken"] is False


def test_sandbox_network_policy(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    name, docs = rendered
    (policy,) = by_kind(docs, "NetworkPolicy")
    spec = policy["spec"]
    assert spec["podSelector"] == {"matchLabels": {"sandboxworkspace.io/component": "runtime"}}
    assert spec["policyTypes"] == ["Ingress", "Egress"]
    (rule,) = spec["ingress"]
    (peer,) = rule["from"]
    assert peer["namespaceSelector"] == {"matchLabels": {"kubernetes.io/metadata.name": NAMESPACE}}
    components = {e["key"]: e["values"] for e in peer["podSelector"]["matchExpressions"]}[
        "app.kubernetes.io/component"
    ]
    assert components == ["api", "operator"]
    assert rule["ports"] == [{"port": 8080, "protocol": "TCP"}]
    if name == "defaults":
        assert spec["egress"] == []
    else:
        assert spec["egress"] == [
            {
                "to": [
                    {
                        "namespaceSelector": {
                            "matchLabels": {"kubernetes.io/metadata.name": NAMESPACE}
                        },
                        "podSelector": {
                            "matchLabels": {
                                "app.kubernetes.io/component": "egress-proxy",
                                "app.kubernetes.io/instance": RELEASE,
                                "app.kubernetes.io/name": "sandbox-workspace",
                            }
                        },
                    }
                ],
                "ports": [{"port": 3128, "protocol": "TCP"}],
            },
            {
                "to": [{"ipBlock": {"cidr": "203.0.113.0/24"}}],
                "ports": [{"port": 443, "protocol": "TCP"}],
            },
        ]


@pytest.mark.parametrize(
    ("cidrs", "internal", "blocks"),
    [
        pytest.param(
            ["0.0.0.0/0"],
            [],
            [{"cidr": "0.0.0.0/0", "except": ["169.254.0.0/16"]}],
            id="link-local-always",
        ),
        pytest.param(
            ["0.0.0.0/0", "::/0"],
            ["10.244.0.0/16", "10.96.0.0/12", "192.168.5.0/24", "fd00::/8"],
            [
                {
                    "cidr": "0.0.0.0/0",
                    "except": ["169.254.0.0/16", "10.244.0.0/16", "10.96.0.0/12", "192.168.5.0/24"],
                },
                {"cidr": "::/0", "except": ["fe80::/10", "fd00::/8"]},
            ],
            id="pod-service-store",
        ),
        pytest.param(
            ["10.0.0.0/8", "10.244.3.0/24", "203.0.113.0/24"],
            ["10.244.0.0/16"],
            [{"cidr": "10.0.0.0/8", "except": ["10.244.0.0/16"]}, {"cidr": "203.0.113.0/24"}],
            id="inside-dropped-outside-untouched",
        ),
    ],
)
def test_cidr_mode_never_opens_link_local_nor_internal_ranges(
    tools: Tools, cidrs: list[str], internal: list[str], blocks: list[dict[str, Any]]
) -> None:
    """Issue 40 item 5: egressCIDRs [0.0.0.0/0] no longer opens the metadata address,
    the pods, the Services or the store."""
    docs = render(
        tools,
        release=RELEASE,
        namespace=NAMESPACE,
        set_values={
            "sandbox.networkPolicy.egressCIDRs": "{" + ",".join(cidrs) + "}",
            **(
                {"sandbox.networkPolicy.internalCIDRs": "{" + ",".join(internal) + "}"}
                if internal
                else {}
            ),
        },
    )
    (policy,) = by_kind(docs, "NetworkPolicy")
    (rule,) = policy["spec"]["egress"]
    assert rule["to"] == [{"ipBlock": b} for b in blocks]


def test_egress_proxy_component(tools: Tools) -> None:
    docs = render(tools, release=RELEASE, namespace=NAMESPACE, values=(HARDENED_VALUES,))
    name = f"{RELEASE}-sandbox-workspace-egress-proxy"
    pod = one(docs, "Deployment", name)["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["args"] == [
        "egress-proxy",
        "--port",
        "3128",
        "--namespace",
        "agent-sandboxes",
        "--interval",
        "2",
        "--forbidden",
        "10.244.0.0/16",
        "--forbidden",
        "10.96.0.0/12",
        "--ca-dir",
        "/etc/sandbox-workspace/egress-ca",
        "--publish-ca",
        f"agent-sandboxes/{RELEASE}-sandbox-workspace-egress-ca",
        "--secret-ttl",
        "5",
        "--max-connections-per-session",
        "64",
        "--idle-timeout",
        "600",
    ]
    assert pod["serviceAccountName"] == name
    assert one(docs, "Service", name)["spec"]["ports"][0]["port"] == 3128
    role = one(docs, "Role", name)
    grants = {(res, v, tuple(r.get("resourceNames", ()))) for r in role["rules"]
              for res in r["resources"] for v in r["verbs"]}  # fmt: skip
    ca_map = (f"{RELEASE}-sandbox-workspace-egress-ca",)
    assert grants == {
        ("sandboxsessions", "get", ()), ("sandboxsessions", "list", ()),
        ("sandboxsessions", "watch", ()), ("pods", "get", ()), ("pods", "list", ()),
        ("pods", "watch", ()),
        ("secrets", "get", ()),  # bound Secrets, by name: no list, no watch
        ("configmaps", "create", ()), ("configmaps", "get", ca_map),
        ("configmaps", "patch", ca_map),
    }  # fmt: skip
    operator = next(d for d in workloads(docs) if "operator" in d["metadata"]["name"])
    proxy = env_of(operator["spec"]["template"]["spec"]["containers"][0])
    assert proxy["SANDBOX_OPERATOR_EGRESS_PROXY"] == f"{name}.{NAMESPACE}.svc:3128"
    api = one(docs, "Deployment", f"{RELEASE}-sandbox-workspace-api")
    default = env_of(api["spec"]["template"]["spec"]["containers"][0])[
        "SANDBOX_WORKSPACE_SESSION_EGRESS"
    ]
    assert json.loads(default)["rules"][0] == {"host": "pypi.org"}


def test_egress_ca_key_is_the_proxys_alone(tools: Tools) -> None:
    """Issue 40: the CA Secret is mounted by the egress proxy only (never the API, the
    operator or a sandbox pod: the operator points sandbox pods at the ConfigMap with the
    public part, which the proxy writes)."""
    docs = render(tools, release=RELEASE, namespace=NAMESPACE, values=(HARDENED_VALUES,))
    ca_secret = f"{RELEASE}-sandbox-workspace-egress-ca"
    mounting = {
        w["metadata"]["name"]
        for w in workloads(docs) + by_kind(docs, "Job")
        for v in w["spec"]["template"]["spec"].get("volumes", [])
        if v.get("secret", {}).get("secretName") == ca_secret
    }
    assert mounting == {f"{RELEASE}-sandbox-workspace-egress-proxy"}
    proxy = one(docs, "Deployment", f"{RELEASE}-sandbox-workspace-egress-proxy")
    (volume,) = [v for v in proxy["spec"]["template"]["spec"]["volumes"] if "secret" in v]
    assert volume["secret"]["defaultMode"] == 0o400
    # Secret files are root's: the kubelet makes them readable by the pod's fsGroup only
    # (without it the proxy, uid 10001, could not read its key and crash-looped: the node
    # tier's helm upgrade --set egressProxy.enabled=true then timed out).
    security = proxy["spec"]["template"]["spec"]["securityContext"]
    assert security["fsGroup"] == security["runAsGroup"] == 10001, security
    operator = next(d for d in workloads(docs) if "operator" in d["metadata"]["name"])
    env = env_of(operator["spec"]["template"]["spec"]["containers"][0])
    assert env["SANDBOX_OPERATOR_EGRESS_CA_CONFIGMAP"] == ca_secret  # the ConfigMap's name
    # Nothing of the CA is in the rendered chart (no genCA: no key in the release record).
    assert "PRIVATE KEY" not in yaml.safe_dump_all(docs)


def test_egress_ca_hook_job(tools: Tools) -> None:
    """The CA is created by a pre-install/pre-upgrade hook Job that keeps an existing one
    (so an upgrade never rotates it); its rights are a hook Role, gone after it ran; a
    platform's own CA (ca.existingSecret) needs no Job."""
    docs = render(tools, release=RELEASE, namespace=NAMESPACE, values=(HARDENED_VALUES,))
    name = f"{RELEASE}-sandbox-workspace-egress-ca"
    job = one(docs, "Job", name)
    hook = job["metadata"]["annotations"]
    assert hook["helm.sh/hook"] == "pre-install,pre-upgrade"
    assert "hook-succeeded" in hook["helm.sh/hook-delete-policy"]
    pod = job["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["args"] == ["egress-ca", "--namespace", NAMESPACE, "--secret", name]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod["serviceAccountName"] == name
    role = one(docs, "Role", name)
    assert role["metadata"]["namespace"] == NAMESPACE
    assert int(role["metadata"]["annotations"]["helm.sh/hook-weight"]) < int(
        hook["helm.sh/hook-weight"]
    )
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]},
        {"apiGroups": [""], "resources": ["secrets"], "resourceNames": [name], "verbs": ["get"]},
    ]
    assert not by_kind(docs, "Secret") or all(
        d["metadata"]["name"] != name for d in by_kind(docs, "Secret")
    )  # not a release resource: upgrade and uninstall leave it alone
    own = render(
        tools,
        release=RELEASE,
        namespace=NAMESPACE,
        values=(HARDENED_VALUES,),
        set_values={"egressProxy.ca.existingSecret": "platform-ca"},
    )
    assert not by_kind(own, "Job")
    proxy = one(own, "Deployment", f"{RELEASE}-sandbox-workspace-egress-proxy")
    secrets = [v["secret"]["secretName"] for v in proxy["spec"]["template"]["spec"]["volumes"]
               if "secret" in v]  # fmt: skip
    assert secrets == ["platform-ca"]


def test_api_deployment_and_service(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    name, docs = rendered
    full = f"{RELEASE}-sandbox-workspace-api"
    deployment = one(docs, "Deployment", full)
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert pod["serviceAccountName"] == full and pod["automountServiceAccountToken"] is True
    assert container["args"][0] == "api"
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    service = one(docs, "Service", full)
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    env = env_of(container)
    assert env["SANDBOX_WORKSPACE_BACKEND"] == "kubernetes"
    assert env["SANDBOX_WORKSPACE_AUTH_MODE"] == "required"
    assert env["SANDBOX_WORKSPACE_SESSION_NETWORK"] == "deny"  # sandbox.network.enabled
    token = env["SANDBOX_WORKSPACE_SERVICE_TOKEN"]["secretKeyRef"]
    if name == "defaults":
        assert env["SANDBOX_WORKSPACE_NAMESPACE"] == "sandbox-sessions"
        assert token == {"name": full, "key": "service-token"}
        secret = one(docs, "Secret", full)
        assert len(secret["data"]["service-token"]) >= 48
        # One stream-token key for every replica (security review M5), kept in the Secret.
        stream = env["SANDBOX_WORKSPACE_STREAM_TOKEN_SECRET"]["secretKeyRef"]
        assert stream == {"name": full, "key": "stream-token-secret"}
        assert len(secret["data"]["stream-token-secret"]) >= 48
        assert "SANDBOX_WORKSPACE_LLM_API_KEY" not in env
        assert json.loads(env["SANDBOX_WORKSPACE_FILE_UPLOAD"]) == {
            "maxFileSize": 100,
            "maxFileSizeUnit": "MB",
            "maxFileCount": 50,
            "allowedFileTypes": ["csv", "xlsx", "json", "txt", "pkl", "png", "jpg", "pdf"],
        }
    else:
        # The E2B key Secret holds no credential of the chart: the API's records (hashes).
        made = [s for s in by_kind(docs, "Secret") if s["metadata"]["name"] != E2B_KEYS]
        assert not made, "existing Secrets only: the chart creates none"
        assert token == {"name": "platform-backend-token", "key": "token"}
        stream = env["SANDBOX_WORKSPACE_STREAM_TOKEN_SECRET"]["secretKeyRef"]
        assert stream == {"name": "platform-stream-token", "key": "hmac"}
        assert env["SANDBOX_WORKSPACE_JWT_SECRET"]["secretKeyRef"] == {
            "name": "platform-jwt",
            "key": "hs256",
        }
        assert env["SANDBOX_WORKSPACE_LLM_BASE_URL"] == "https://llm.example.internal/v1"
        assert env["SANDBOX_WORKSPACE_LLM_MODEL"] == "agent-large"
        assert env["SANDBOX_WORKSPACE_LLM_API_KEY"]["secretKeyRef"] == {
            "name": "llm-credentials",
            "key": "api-key",
        }
        assert env["SANDBOX_WORKSPACE_SESSION_TTL_SECONDS"] == "86400"
        assert pod["imagePullSecrets"] == [{"name": "platform-registry"}]


def test_api_replicas_share_runs_through_the_redis_run_store(
    rendered: tuple[str, list[dict[str, Any]]],
) -> None:
    """memory (defaults): one replica, no PodDisruptionBudget; redis (hardened): the URL
    from a Secret, two replicas, a PodDisruptionBudget, a surge-first rolling update and
    a grace period long enough for the hand-over."""
    name, docs = rendered
    full = f"{RELEASE}-sandbox-workspace-api"
    deployment = one(docs, "Deployment", full)
    pod = deployment["spec"]["template"]["spec"]
    env = env_of(pod["containers"][0])
    if name == "defaults":
        assert env["SANDBOX_WORKSPACE_CHAT_RUN_STORE"] == "memory"
        assert "SANDBOX_WORKSPACE_CHAT_REDIS_URL" not in env
        assert deployment["spec"]["replicas"] == 1 and "strategy" not in deployment["spec"]
        assert not by_kind(docs, "PodDisruptionBudget")
        return
    assert env["SANDBOX_WORKSPACE_CHAT_RUN_STORE"] == "redis"
    assert env["SANDBOX_WORKSPACE_CHAT_REDIS_URL"]["secretKeyRef"] == {
        "name": "chat-run-store",
        "key": "url",
    }
    assert env["SANDBOX_WORKSPACE_CHAT_RUN_LEASE_SECONDS"] == "10"
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    assert pod["terminationGracePeriodSeconds"] == 40  # handoverSeconds 20 + 20
    pdb = one(docs, "PodDisruptionBudget", full)
    assert pdb["spec"] == {
        "minAvailable": 1,
        "selector": deployment["spec"]["selector"],
    }


def test_the_redis_run_store_needs_the_secret_of_its_url(tools: Tools) -> None:
    result = render_text(tools, set_values={"chat.runStore": "redis"}, check=False)
    assert result.returncode != 0
    assert "chat.runStore=redis needs chat.redis.existingSecret" in result.stderr


@pytest.mark.parametrize(
    "jwt_values",
    [
        pytest.param({"auth.jwt.jwksUrl": "https://id.example/jwks"}, id="jwks"),
        pytest.param(
            {"auth.jwt.existingSecret": "k", "auth.jwt.audience": "sandbox"}, id="hs256-no-iss"
        ),
    ],
)
def test_jwts_need_an_audience_and_an_issuer(tools: Tools, jwt_values: dict) -> None:
    result = render_text(tools, set_values=jwt_values, check=False)
    assert result.returncode != 0
    assert "auth.jwt.audience and auth.jwt.issuer are required" in result.stderr


def _operator_env(docs: list[dict[str, Any]]) -> dict[str, str]:
    workload = one(docs, "StatefulSet", f"{RELEASE}-sandbox-workspace-operator")
    (container,) = workload["spec"]["template"]["spec"]["containers"]
    return env_of(container)


def test_gvisor_without_landlock_must_choose_confinement_explicitly(tools: Tools) -> None:
    """gVisor has no Landlock: with the default ``require`` every execution would answer
    503, so the install is refused until ``sandbox.confinement=auto`` is chosen."""
    result = render_text(tools, set_values={"sandbox.runtimeClassName": "gvisor"}, check=False)
    assert result.returncode != 0
    assert "Set sandbox.confinement=auto" in result.stderr
    chosen = {"sandbox.runtimeClassName": "gvisor", "sandbox.confinement": "auto"}
    assert _operator_env(render(tools, set_values=chosen))["SANDBOX_OPERATOR_CONFINEMENT"] == "auto"
    env = _operator_env(render(tools, set_values={"sandbox.confinementMinAbi": "3"}))
    assert (env["SANDBOX_OPERATOR_CONFINEMENT"], env["SANDBOX_OPERATOR_CONFINEMENT_MIN_ABI"]) == (
        "require",
        "3",
    )


def test_operator_workload(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    name, docs = rendered
    full = f"{RELEASE}-sandbox-workspace-operator"
    # Two replicas by default: one active, one standby (kopf peering, ordinal priorities).
    workload = one(docs, "StatefulSet", full)
    assert workload["spec"]["replicas"] == 2
    (peering,) = by_kind(docs, "KopfPeering")
    peering_name = "sandbox-workspace" if name == "defaults" else "sandbox-workspace-peering"
    assert peering["metadata"] == {
        **peering["metadata"],
        "name": peering_name,
        "namespace": f"{NAMESPACE}-sessions" if name == "defaults" else "agent-sandboxes",
    }
    (container,) = workload["spec"]["template"]["spec"]["containers"]
    env = env_of(container)
    assert env["SANDBOX_OPERATOR_STANDALONE"] == "false"
    assert env["SANDBOX_OPERATOR_PEERING_NAME"] == peering_name
    assert env["SANDBOX_OPERATOR_PRIORITY"] == {
        "fieldRef": {"fieldPath": "metadata.labels['apps.kubernetes.io/pod-index']"}
    }
    if name == "defaults":
        assert env["SANDBOX_OPERATOR_IMAGE"] == "sandbox-workspace:0.1.0"
        assert "SANDBOX_OPERATOR_RUNTIME_CLASS_NAME" not in env
    else:
        assert env["SANDBOX_OPERATOR_RUNTIME_CLASS_NAME"] == "gvisor"
        assert env["SANDBOX_OPERATOR_IMAGE"] == (
            "registry.example.internal/platform/sandbox-runtime:0.1.0-py311"
        )
        assert env["SANDBOX_OPERATOR_CHECK_INTERVAL_SECONDS"] == "15"
    # Fail closed by default; the hardened values (gVisor) chose auto explicitly.
    assert env["SANDBOX_OPERATOR_CONFINEMENT"] == ("auto" if name == "hardened" else "require")
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"health": 8081, "metrics": 9090}


def test_tracing_endpoint_reaches_the_api_and_the_operator(
    tools: Tools, rendered: tuple[str, list[dict[str, Any]]]
) -> None:
    """tracing.otlpEndpoint: both processes export to it; unset (every value set here),
    neither has any OTEL_ variable, so neither sets tracing up."""
    _, docs = rendered
    for workload in workloads(docs):
        for container in workload["spec"]["template"]["spec"]["containers"]:
            env = env_of(container) if "env" in container else {}
            assert not any(name.startswith("OTEL_") for name in env)
    endpoint = "http://otel-collector.observability:4318"
    traced = render(tools, set_values={"tracing.otlpEndpoint": endpoint})
    for full in ("sw-sandbox-workspace-api", "sw-sandbox-workspace-operator"):
        (workload,) = [w for w in workloads(traced) if w["metadata"]["name"] == full]
        (container,) = workload["spec"]["template"]["spec"]["containers"]
        assert env_of(container)["OTEL_EXPORTER_OTLP_ENDPOINT"] == endpoint


def _plain_env(container: dict[str, Any], secrets: dict[str, str]) -> dict[str, str]:
    """The container's environment as the kubelet would give it (Secrets resolved)."""
    out = {}
    for item in container["env"]:
        if "value" in item:
            out[item["name"]] = item["value"]
        elif "secretKeyRef" in item["valueFrom"]:
            out[item["name"]] = secrets.get(item["valueFrom"]["secretKeyRef"]["name"], "x" * 32)
        else:
            out[item["name"]] = "0"  # fieldRef: the pod index / name
    return out


def test_the_processes_accept_the_charts_settings(
    rendered: tuple[str, list[dict[str, Any]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every SANDBOX_* variable the chart sets parses into the processes' settings with
    the meaning the values intend (a renamed setting or a bad format fails here)."""
    name, docs = rendered
    api = one(docs, "Deployment", f"{RELEASE}-sandbox-workspace-api")
    operator = one(
        docs,
        "StatefulSet" if any(d["kind"] == "StatefulSet" for d in docs) else "Deployment",
        f"{RELEASE}-sandbox-workspace-operator",
    )
    for container, settings_cls in (
        (api["spec"]["template"]["spec"]["containers"][0], ApiSettings),
        (operator["spec"]["template"]["spec"]["containers"][0], OperatorSettings),
    ):
        env = _plain_env(container, {})
        for key in list(__import__("os").environ):
            if key.startswith(("SANDBOX_WORKSPACE_", "SANDBOX_OPERATOR_")):
                monkeypatch.delenv(key)
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        settings = settings_cls(host="0.0.0.0") if settings_cls is ApiSettings else settings_cls()
        if isinstance(settings, ApiSettings):
            assert settings.backend == "kubernetes" and settings.auth_mode == "required"
            limits = settings.file_upload
            expected = (20, "MB", 10) if name == "hardened" else (100, "MB", 50)
            assert (limits.max_file_size, limits.max_file_size_unit, limits.max_file_count) == (
                expected
            )
            assert settings.session_idle_timeout_seconds == (900 if name == "hardened" else 1800)
            assert settings.chat_run_store == ("redis" if name == "hardened" else "memory")
            _assert_store(name, settings.store, settings.s3)
        else:
            assert settings.namespaces == [
                "agent-sandboxes" if name == "hardened" else "sandbox-sessions"
            ]
            limits = settings.default_resources.limits
            assert limits is not None
            assert str(limits.memory) == ("2Gi" if name == "hardened" else "1Gi")
            assert settings.liveness_endpoint == "http://0.0.0.0:8081/healthz"
            assert settings.metrics_port == 9090
            assert settings.standalone is False  # two peered replicas by default
            # Every install refuses to run code unconfined unless it chose otherwise: the
            # hardened values run gVisor (no Landlock) and chose auto.
            assert settings.confinement == ("auto" if name == "hardened" else "require")
            assert settings.confinement_min_abi == 6
            _assert_store(name, settings.store, settings.s3)


def _assert_store(name: str, mode: str, s3: Any) -> None:
    """Defaults: no store; hardened: the same bucket for the API and the operator, keys
    from the existing Secret."""
    if name == "defaults":
        assert mode == "local"
        return
    assert (mode, s3.bucket, s3.endpoint_url, s3.prefix) == (
        "s3",
        "agent-workspaces",
        "http://seaweedfs.storage.svc:8333",
        "workspaces/",
    )
    assert s3.access_key_id is not None and s3.secret_access_key is not None


def test_the_store_reads_its_keys_from_the_existing_secret(
    rendered: tuple[str, list[dict[str, Any]]],
) -> None:
    name, docs = rendered
    for workload in workloads(docs):
        if "egress-proxy" in workload["metadata"]["name"]:
            continue  # it holds no store credential
        env = env_of(workload["spec"]["template"]["spec"]["containers"][0])
        prefix = "SANDBOX_WORKSPACE_" if "SANDBOX_WORKSPACE_STORE" in env else "SANDBOX_OPERATOR_"
        assert env[prefix + "STORE"] == ("s3" if name == "hardened" else "local")
        if name == "hardened":
            assert env[prefix + "S3__SECRET_ACCESS_KEY"]["secretKeyRef"] == {
                "name": "workspace-store",
                "key": "secret-access-key",
            }


def test_store_s3_needs_a_bucket(tools: Tools) -> None:
    result = render_text(tools, set_values={"store.mode": "s3"}, check=False)
    assert result.returncode != 0
    assert "store.mode=s3 needs store.s3.bucket" in result.stderr


def test_notes_tell_how_to_reach_and_try_the_api(tools: Tools, tmp_path: Path) -> None:
    """NOTES.txt rendered (helm renders it only on a real install: a copy of the chart
    turns it into a ConfigMap that `helm template` shows)."""
    chart = tmp_path / "chart"
    shutil.copytree(CHART, chart)
    notes = (chart / "templates" / "NOTES.txt").read_text()
    (chart / "templates" / "NOTES.txt").unlink()
    (chart / "templates" / "_notes.tpl").write_text(
        '{{- define "notes" -}}' + notes + "{{- end -}}"
    )
    (chart / "templates" / "notes.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: notes}\n"
        'data: {notes: {{ include "notes" . | quote }}}\n'
    )
    args = ["template", RELEASE, str(chart), "--namespace", NAMESPACE, "-s", "templates/notes.yaml"]
    text = yaml.safe_load(helm(tools, *args).stdout)["data"]["notes"]
    assert f"port-forward service/{RELEASE}-sandbox-workspace-api 8000:80" in text
    assert "X-User-Id: alice" in text and "/files/upload" in text and "/execute" in text
    assert "kubectl -n sandbox-sessions get sbs,cws,pods" in text


def test_the_payload_signing_is_the_stores_default_unless_set(tools: Tools) -> None:
    """``store.s3.signPayload`` null sets nothing (the store decides by its scheme: signed
    over http://); true or false reach both processes as the setting."""
    base = {"store.mode": "s3", "store.s3.bucket": "b", "store.s3.endpointUrl": "http://s:8333"}
    for given, expected in ((None, None), ("false", "false"), ("true", "true")):
        extra = {} if given is None else {"store.s3.signPayload": given}
        docs = render(tools, set_values={**base, **extra})
        for workload in workloads(docs):
            env = env_of(workload["spec"]["template"]["spec"]["containers"][0])
            prefix = (
                "SANDBOX_WORKSPACE_" if "SANDBOX_WORKSPACE_STORE" in env else "SANDBOX_OPERATOR_"
            )
            assert env.get(prefix + "S3__SIGN_PAYLOAD") == expected, (given, env)
