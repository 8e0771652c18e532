"""The chart's observability objects (values ``monitoring.*``): a ServiceMonitor for the
API and a PodMonitor for the operator, a PrometheusRule with the alerts
docs/operations.md names, and the Grafana dashboard in a ConfigMap for Grafana's
sidecar — off by default, strictly valid when on (kubeconform against the
monitoring.coreos.com schemas of tests/chart/monitoring-crds.yaml), and naming only
metrics the code defines.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from charttools import Tools, kubeconform, render, render_text
from doc_blocks import OPERATIONS
from metric_names import base_metric, metrics_in_code

RELEASE, NAMESPACE = "sw", "sandbox"
ALL_ON = {
    "monitoring.serviceMonitor.enabled": "true",
    "monitoring.prometheusRule.enabled": "true",
    "monitoring.grafanaDashboard.enabled": "true",
}
KINDS = {"ServiceMonitor", "PodMonitor", "PrometheusRule"}
METRIC = re.compile(r"\bsandbox_\w+")


@pytest.fixture(scope="module")
def monitored(tools: Tools) -> list[dict[str, Any]]:
    return render(tools, release=RELEASE, namespace=NAMESPACE, set_values=ALL_ON)


def _of(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def _dashboard(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (configmap,) = [
        d for d in _of(docs, "ConfigMap") if "grafana_dashboard" in d["metadata"]["labels"]
    ]
    return json.loads(configmap["data"]["sandbox-workspace.json"])


def _rule_exprs(docs: list[dict[str, Any]]) -> dict[str, str]:
    (rule,) = _of(docs, "PrometheusRule")
    return {r["alert"]: r["expr"] for g in rule["spec"]["groups"] for r in g["rules"]}


def _dashboard_exprs(docs: list[dict[str, Any]]) -> list[str]:
    return [t["expr"] for p in _dashboard(docs)["panels"] for t in p["targets"]]


def test_off_by_default(tools: Tools) -> None:
    docs = render(tools, release=RELEASE, namespace=NAMESPACE)
    assert not [d for d in docs if d["kind"] in KINDS]
    assert not [d for d in _of(docs, "ConfigMap") if "grafana_dashboard" in d["metadata"]["labels"]]


def test_kubeconform_strict_accepts_the_monitoring_objects(
    tools: Tools, schema_dir: Path, tmp_path: Path
) -> None:
    text = render_text(tools, release=RELEASE, namespace=NAMESPACE, set_values=ALL_ON).stdout
    docs = [d for d in yaml.safe_load_all(text) if d]
    assert {d["kind"] for d in docs} >= KINDS
    manifests = tmp_path / "monitoring.yaml"
    manifests.write_text(text)
    summary = kubeconform(tools, schema_dir, manifests)["summary"]
    assert summary["valid"] == len(docs) and summary["skipped"] == 0, summary
    # A misplaced field is refused: the schemas are strict, not permissive stand-ins.
    (monitor,) = [d for d in docs if d["kind"] == "ServiceMonitor"]
    monitor["spec"]["endpoints"][0]["intervall"] = "30s"
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(monitor))
    assert kubeconform(tools, schema_dir, bad, check=False)["returncode"] != 0


def test_monitors_scrape_the_ports_that_serve_metrics(monitored: list[dict[str, Any]]) -> None:
    (service,) = [
        d for d in _of(monitored, "Service") if d["metadata"]["name"] == "sw-sandbox-workspace-api"
    ]
    (monitor,) = _of(monitored, "ServiceMonitor")
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    assert [e["port"] for e in monitor["spec"]["endpoints"]] == [
        service["spec"]["ports"][0]["name"]
    ]
    (operator,) = [
        d
        for d in monitored
        if d["kind"] in ("StatefulSet", "Deployment") and "operator" in d["metadata"]["name"]
    ]
    (pod_monitor,) = _of(monitored, "PodMonitor")
    pod_labels = operator["spec"]["template"]["metadata"]["labels"]
    assert pod_monitor["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    ports = {
        p["name"] for c in operator["spec"]["template"]["spec"]["containers"] for p in c["ports"]
    }
    assert pod_monitor["spec"]["podMetricsEndpoints"][0]["port"] in ports


def test_every_metric_in_the_rules_and_the_dashboard_is_defined(
    monitored: list[dict[str, Any]],
) -> None:
    known = metrics_in_code()
    exprs = [*_rule_exprs(monitored).values(), *_dashboard_exprs(monitored)]
    named = {base_metric(m, known) for e in exprs for m in METRIC.findall(e)}
    assert named, exprs
    assert named - known == set(), f"metrics no code defines: {named - known}"


def test_every_metric_the_docs_say_to_watch_is_alerted_on_or_charted(
    monitored: list[dict[str, Any]],
) -> None:
    table = (
        OPERATIONS.read_text().split("## Metrics and what to alert on", 1)[1].split("\n## ", 1)[0]
    )
    watched = {
        row[0].strip(" `")
        for row in (
            line.strip("|").split("|")
            for line in table.splitlines()
            if line.startswith("| `sandbox_")
        )
        if row[3].strip()
    }
    assert "sandbox_chat_runs_ended_total" in watched
    known = metrics_in_code()
    rules = {
        base_metric(m, known) for e in _rule_exprs(monitored).values() for m in METRIC.findall(e)
    }
    charted = {
        base_metric(m, known) for e in _dashboard_exprs(monitored) for m in METRIC.findall(e)
    }
    assert watched - (rules | charted) == set()
    # What to alert on is alerted on; the rest ("look here when") is at least on the dashboard.
    assert {
        "sandbox_api_requests_total",
        "sandbox_chat_runs_ended_total",
        "sandbox_operator_errors_total",
    } <= rules


def test_the_dashboard_configmap_is_what_grafana_loads(monitored: list[dict[str, Any]]) -> None:
    dashboard = _dashboard(monitored)
    assert dashboard["uid"] == "sandbox-workspace" and dashboard["panels"]
    assert len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"])
    assert all(p["datasource"]["uid"] == "${datasource}" for p in dashboard["panels"])


def test_a_metrics_port_of_its_own_is_what_the_monitor_scrapes(tools: Tools) -> None:
    """``api.metricsPort``: the API gets SANDBOX_WORKSPACE_METRICS_PORT, its pod and
    Service a `metrics` port, and the ServiceMonitor scrapes that port, not `http`."""
    docs = render(
        tools,
        release=RELEASE,
        namespace=NAMESPACE,
        set_values={**ALL_ON, "api.metricsPort": "9100"},
    )
    (service,) = [
        d for d in _of(docs, "Service") if d["metadata"]["name"] == "sw-sandbox-workspace-api"
    ]
    assert {p["name"]: p["port"] for p in service["spec"]["ports"]}["metrics"] == 9100
    (api,) = [
        d for d in _of(docs, "Deployment") if d["metadata"]["name"] == service["metadata"]["name"]
    ]
    (container,) = api["spec"]["template"]["spec"]["containers"]
    assert {"name": "metrics", "containerPort": 9100, "protocol": "TCP"} in container["ports"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["SANDBOX_WORKSPACE_METRICS_PORT"] == "9100"
    (monitor,) = _of(docs, "ServiceMonitor")
    assert [e["port"] for e in monitor["spec"]["endpoints"]] == ["metrics"]
    refused = render_text(
        tools,
        release=RELEASE,
        namespace=NAMESPACE,
        set_values={"api.metricsPort": "80"},
        check=False,
    )
    assert refused.returncode != 0 and "metricsPort" in refused.stderr
