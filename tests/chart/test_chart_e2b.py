"""The chart's E2B host routing (values ``e2b.*``, issue 39 item 2): the API gets
SANDBOX_WORKSPACE_E2B_DOMAIN and a wildcard Ingress sends *.{domain} to its Service
(strictly valid, kubeconform); nothing without a domain; wrong values refused."""

from __future__ import annotations

from pathlib import Path

import yaml
from charttools import Tools, kubeconform, render, render_text

RELEASE, NAMESPACE = "sw", "sandbox"
ON = {
    "e2b.domain": "sandboxes.example.com",
    "e2b.ingress.enabled": "true",
    "e2b.ingress.className": "nginx",
    "e2b.ingress.tlsSecretName": "sandboxes-wildcard-tls",
    "e2b.ingress.annotations.cert-manager\\.io/cluster-issuer": "letsencrypt-dns",
}


def test_a_domain_gives_the_api_its_setting_and_a_wildcard_ingress(
    tools: Tools, schema_dir: Path, tmp_path: Path
) -> None:
    docs = render(tools, release=RELEASE, namespace=NAMESPACE, set_values=ON)
    (ingress,) = [d for d in docs if d["kind"] == "Ingress"]
    spec = ingress["spec"]
    assert spec["ingressClassName"] == "nginx"
    assert spec["tls"] == [
        {"hosts": ["*.sandboxes.example.com"], "secretName": "sandboxes-wildcard-tls"}
    ]
    (rule,) = spec["rules"]
    assert rule["host"] == "*.sandboxes.example.com"  # api.{domain} and {port}-{id}.{domain}
    backend = rule["http"]["paths"][0]["backend"]["service"]
    assert backend == {"name": "sw-sandbox-workspace-api", "port": {"name": "http"}}
    assert ingress["metadata"]["annotations"] == {
        "cert-manager.io/cluster-issuer": "letsencrypt-dns"
    }
    (api,) = [
        d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == backend["name"]
    ]
    env = {
        e["name"]: e.get("value") for e in api["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    assert env["SANDBOX_WORKSPACE_E2B_DOMAIN"] == "sandboxes.example.com"
    (tmp_path / "ingress.yaml").write_text(yaml.safe_dump(ingress))
    assert kubeconform(tools, schema_dir, tmp_path / "ingress.yaml")["summary"]["valid"] == 1


def test_without_a_domain_nothing_changes_and_bad_values_are_refused(tools: Tools) -> None:
    docs = render(tools, release=RELEASE, namespace=NAMESPACE)
    assert not [d for d in docs if d["kind"] == "Ingress"]
    pods = [d["spec"]["template"]["spec"] for d in docs if d["kind"] == "Deployment"]
    env = [e["name"] for pod in pods for c in pod["containers"] for e in c.get("env", [])]
    assert "SANDBOX_WORKSPACE_E2B_DOMAIN" not in env
    for values, says in (
        ({"e2b.ingress.enabled": "true"}, "e2b.domain"),
        ({"e2b.domain": "*.example.com"}, "domain"),
        ({"e2b.domain": "Example.com"}, "domain"),
    ):
        refused = render_text(
            tools, release=RELEASE, namespace=NAMESPACE, set_values=values, check=False
        )
        assert refused.returncode != 0 and says in refused.stderr, (values, refused.stderr)
