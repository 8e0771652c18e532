"""Pure builders of what the kind tier deploys into one namespace: the operator and the
API (``kubernetes`` backend), each with its own ServiceAccount and least-privilege Role.
No I/O. The environment of each process is its own function, so a deployment and a
process started outside the cluster with the same RBAC are configured alike.
"""

from __future__ import annotations

from typing import Any

GROUP = "sandboxworkspace.io"
OPERATOR = "sandbox-operator"
API = "sandbox-api"
API_PORT = 8000
TOKEN_SECRET = "sandbox-api-token"
RUNTIME_UID = 10001

OPERATOR_RULES: list[dict[str, Any]] = [
    {
        "apiGroups": [GROUP],
        "resources": ["sandboxsessions", "conversationworkspaces"],
        "verbs": ["get", "list", "watch", "patch", "update", "delete"],
    },
    {
        "apiGroups": [GROUP],
        "resources": ["sandboxsessions/status", "conversationworkspaces/status"],
        "verbs": ["get", "patch", "update"],
    },
    {
        "apiGroups": [""],
        "resources": ["pods"],
        "verbs": ["get", "list", "watch", "create", "delete"],
    },
    {
        "apiGroups": [""],
        "resources": ["secrets", "persistentvolumeclaims"],
        "verbs": ["get", "create"],
    },
    {"apiGroups": ["", "events.k8s.io"], "resources": ["events"], "verbs": ["create"]},
]

# kopf scans the cluster even when it watches one namespace: it lists and watches
# CustomResourceDefinitions and Namespaces (without this it retries, then runs blind to
# resources added later). Checked on the cluster tier: without it the log fills with 403s.
OPERATOR_CLUSTER_RULES: list[dict[str, Any]] = [
    {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get", "list", "watch"]},
    {
        "apiGroups": ["apiextensions.k8s.io"],
        "resources": ["customresourcedefinitions"],
        "verbs": ["get", "list", "watch"],
    },
]

API_RULES: list[dict[str, Any]] = [
    {
        "apiGroups": [GROUP],
        "resources": ["sandboxsessions"],
        "verbs": ["get", "list", "watch", "create", "patch", "delete"],
    },
    {
        "apiGroups": [GROUP],
        "resources": ["conversationworkspaces"],
        "verbs": ["get", "create", "delete"],
    },
    {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]},
]


def operator_env(namespace: str, image: str) -> dict[str, str]:
    return {
        "SANDBOX_OPERATOR_NAMESPACES": namespace,
        "SANDBOX_OPERATOR_IMAGE": image,
        "SANDBOX_OPERATOR_IMAGE_PULL_POLICY": "IfNotPresent",
        "SANDBOX_OPERATOR_STANDALONE": "true",
        "SANDBOX_OPERATOR_METRICS_PORT": "",
        "SANDBOX_OPERATOR_LOG_FORMAT": "text",
    }


def api_env(namespace: str, host: str = "0.0.0.0") -> dict[str, str]:
    """Without the service token, which comes from the Secret (or the caller)."""
    return {
        "SANDBOX_WORKSPACE_BACKEND": "kubernetes",
        "SANDBOX_WORKSPACE_HOST": host,
        "SANDBOX_WORKSPACE_PORT": str(API_PORT),
        "SANDBOX_WORKSPACE_AUTH_MODE": "required",
        "SANDBOX_WORKSPACE_NAMESPACE": namespace,
        "SANDBOX_WORKSPACE_LOG_FORMAT": "text",
    }


def _rbac(name: str, namespace: str, rules: list[dict[str, Any]]) -> list[dict[str, Any]]:
    meta = {"name": name, "namespace": namespace}
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": meta,
            "rules": rules,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": meta,
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}],
        },
    ]


def operator_cluster_role_name(namespace: str) -> str:
    """Cluster-scoped, so named after the namespace: test runs do not collide."""
    return f"{OPERATOR}-{namespace}"


def _cluster_rbac(namespace: str) -> list[dict[str, Any]]:
    name = operator_cluster_role_name(namespace)
    return [
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": name},
            "rules": OPERATOR_CLUSTER_RULES,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": name},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": name,
            },
            "subjects": [{"kind": "ServiceAccount", "name": OPERATOR, "namespace": namespace}],
        },
    ]


def _deployment(
    name: str, namespace: str, image: str, args: list[str], env: list[dict], probe: dict
) -> dict[str, Any]:
    labels = {"app.kubernetes.io/name": name}
    container = {
        "name": name,
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["sandbox-workspace", *args],
        "env": env,
        "readinessProbe": probe,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": RUNTIME_UID,
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        },
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {
            "replicas": 1,
            "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "serviceAccountName": name,
                    "containers": [container],
                    "volumes": [{"name": "tmp", "emptyDir": {}}],
                },
            },
        },
    }


def _env_list(env: dict[str, str]) -> list[dict[str, Any]]:
    return [{"name": k, "value": v} for k, v in env.items()]


def operator_objects(namespace: str, image: str) -> list[dict[str, Any]]:
    probe = {"httpGet": {"path": "/healthz", "port": 8081}, "periodSeconds": 2}
    env = _env_list(operator_env(namespace, image))
    return [
        *_rbac(OPERATOR, namespace, OPERATOR_RULES),
        *_cluster_rbac(namespace),
        _deployment(OPERATOR, namespace, image, ["operator"], env, probe),
    ]


def api_objects(namespace: str, image: str, service_token: str) -> list[dict[str, Any]]:
    token_ref = {"secretKeyRef": {"name": TOKEN_SECRET, "key": "token"}}
    env = [
        *_env_list(api_env(namespace)),
        {"name": "SANDBOX_WORKSPACE_SERVICE_TOKEN", "valueFrom": token_ref},
    ]
    probe = {"httpGet": {"path": "/healthz", "port": API_PORT}, "periodSeconds": 2}
    return [
        *_rbac(API, namespace, API_RULES),
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": TOKEN_SECRET, "namespace": namespace},
            "stringData": {"token": service_token},
        },
        _deployment(API, namespace, image, ["api"], env, probe),
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": API, "namespace": namespace},
            "spec": {
                "selector": {"app.kubernetes.io/name": API},
                "ports": [{"name": "http", "port": API_PORT, "targetPort": API_PORT}],
            },
        },
    ]
