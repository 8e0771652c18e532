"""Egress policies of sessions on Kubernetes (issue 40): the spec model and its clear
refusals, the proxy's pod address → session index, the sandbox pod's proxy settings,
secrets bound in the spec (placeholders, the Kubernetes SecretSource)."""

from __future__ import annotations

import asyncio
import base64
import json
import re
import time

import pytest
from pydantic import ValidationError

from sandbox_workspace.egress.cluster import (
    ClusterPolicies,
    SecretRef,
    address_index,
    policy_from_spec,
    session_policy,
)
from sandbox_workspace.egress.kube_secrets import (
    ANNOTATION_EGRESS_HOSTS,
    LABEL_EGRESS_SECRET,
    KubeSecretSource,
)
from sandbox_workspace.egress.policy import PolicyError, decide
from sandbox_workspace.egress.secrets import SecretUnavailable
from sandbox_workspace.operator.builders import EGRESS_CA_BUNDLE, build_sandbox_pod
from sandbox_workspace.operator.main import resolve_egress_proxy
from sandbox_workspace.operator.models import EgressSpec, SandboxSession, SandboxSessionSpec
from sandbox_workspace.operator.pool.spec import build_pool_pod, claim_egress, misfits
from sandbox_workspace.operator.settings import OperatorSettings

RUNTIME = {"sandboxworkspace.io/component": "runtime"}


def pod(session: str | None, ip: str, *, namespace: str = "ns", **extra: object) -> dict:
    labels = dict(RUNTIME, **({"sandboxworkspace.io/session": session} if session else {}))
    meta = {"name": f"p-{ip}", "namespace": namespace, "labels": labels}
    meta.update(extra.pop("meta", {}))  # type: ignore[arg-type]
    return {"metadata": meta, "status": {"podIP": ip}, **extra}


def session(name: str, egress: object = None, namespace: str = "ns") -> dict:
    spec = {"userId": "u"} | ({"egress": egress} if egress is not None else {})
    return {"metadata": {"name": name, "namespace": namespace}, "spec": spec}


# ----------------------------------------------------------------------- the spec model
def test_spec_egress_is_validated_by_the_policy_rules_with_the_bad_rule_named():
    spec = EgressSpec.model_validate(
        {
            "rules": [
                {"host": "PyPI.org."},
                {"host": "*.example.com", "ports": [80], "schemes": ["http"]},
            ]
        }
    )
    assert decide(spec.policy(), "https", "pypi.org", 443).allowed
    assert decide(spec.policy(), "http", "a.example.com", 80).allowed
    for rule, complaint in [
        ({"host": "10.0.0.1"}, "not IP addresses"),
        ({"host": "a.*.com"}, "not a valid host name"),
        ({"host": "pypi.org", "ports": [0]}, "ports must be 1-65535"),
        ({"host": "pypi.org", "schemes": ["ftp"]}, "schemes"),
        ({"host": "bad host"}, "not a valid host name"),
    ]:
        with pytest.raises(ValidationError) as caught:
            EgressSpec.model_validate({"rules": [{"host": "ok.org"}, rule]})
        assert complaint in str(caught.value), rule
        assert "rules.1" in str(caught.value)  # which rule
    with pytest.raises(ValidationError):
        EgressSpec.model_validate({"rules": [{"host": f"h{i}.org"} for i in range(101)]})


def test_proxy_reads_the_spec_without_the_models_and_refuses_what_they_refuse():
    assert policy_from_spec({"rules": [{"host": "pypi.org"}]}).rules[0].host == "pypi.org"
    for raw in (
        {"rules": "x"},
        {"rules": [{"host": 1}]},
        {"rules": [{"host": "a.org", "ports": ["443"]}]},
        [],
    ):
        with pytest.raises(PolicyError):
            policy_from_spec(raw)
    # An invalid policy (written around the apiserver's schema) is no policy: deny all.
    assert session_policy(session("s", {"rules": [{"host": "127.0.0.1"}]})) is None
    assert session_policy(session("s")) is None


# ---------------------------------------------------------------- address → session
def test_address_index_maps_only_unambiguous_live_sandbox_pods():
    pods = [
        pod("a", "10.0.0.1"),
        pod("b", "10.0.0.2", meta={"deletionTimestamp": "2026-01-01T00:00:00Z"}),
        pod(None, "10.0.0.3"),  # a free pool pod: no session
        pod("c", "10.0.0.4"),
        pod("d", "10.0.0.4"),  # an address claimed twice: nobody's
        pod("e", "10.0.0.5", spec={"hostNetwork": True}),
        {
            "metadata": {
                "name": "x",
                "namespace": "ns",
                "labels": {"sandboxworkspace.io/session": "f"},
            },
            "status": {"podIP": "10.0.0.6"},
        },
        pod("g", "fd00::7"),
    ]
    assert address_index(pods) == {"10.0.0.1": "ns/a", "fd00::7": "ns/g"}


def test_identify_uses_the_peer_address_and_denies_when_the_view_is_stale():
    view = ClusterPolicies(max_stale=30)
    view.update(
        [session("a", {"rules": [{"host": "pypi.org"}]}), session("b")],
        [pod("a", "10.0.0.1"), pod("b", "10.0.0.2")],
    )
    assert view.identify(("::ffff:10.0.0.1", 5000, 0, 0)) == "ns/a"
    assert view.identify(("10.0.0.9", 5000)) is None and view.identify(None) is None
    assert decide(view.lookup("ns/a"), "https", "pypi.org", 443).allowed
    assert view.lookup("ns/b") is None  # no policy: closed
    view.read_at = time.monotonic() - 31
    assert view.lookup("ns/a") is None


# ------------------------------------------------------------------- the sandbox pod
def env(manifest: dict) -> dict:
    return {e["name"]: e.get("value") for e in manifest["spec"]["containers"][0]["env"]}


def code_env(manifest: dict) -> dict:
    """What the session's executed code sees beside the runtime's own variables."""
    return json.loads(env(manifest).get("SANDBOX_RUNTIME_CODE_ENV", "{}"))


def test_code_with_a_policy_reaches_the_proxys_port_alone_and_sees_its_address():
    settings = OperatorSettings(_env_file=None, image="i", egress_proxy="10.96.0.9:3128")
    plain = SandboxSession(name="s", namespace="ns", spec=SandboxSessionSpec(user_id="u"))
    with_policy = SandboxSession(
        name="s",
        namespace="ns",
        spec=SandboxSessionSpec.model_validate({"userId": "u", "egress": {"rules": []}}),
    )
    assert env(build_sandbox_pod(plain, settings))["SANDBOX_RUNTIME_NETWORK"] == "deny"
    assert code_env(build_sandbox_pod(plain, settings)) == {}
    pod = build_sandbox_pod(with_policy, settings)
    assert env(pod)["SANDBOX_RUNTIME_NETWORK"] == "proxy_port"
    assert env(pod)["SANDBOX_RUNTIME_EGRESS_PROXY_PORT"] == "3128"
    assert code_env(pod)["HTTPS_PROXY"] == code_env(pod)["https_proxy"] == "http://10.96.0.9:3128"
    # The code's environment, never the runtime process's: its own calls stay direct.
    assert not {"HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"} & set(env(pod))
    # No proxy on this cluster: nothing to reach, so no socket at all.
    no_proxy = OperatorSettings(_env_file=None, image="i")
    assert env(build_sandbox_pod(with_policy, no_proxy))["SANDBOX_RUNTIME_NETWORK"] == "deny"
    assert code_env(build_sandbox_pod(with_policy, no_proxy)) == {}
    # CIDR mode keeps its whole network; a policy beside it still names the proxy.
    both = SandboxSession(
        name="s",
        namespace="ns",
        spec=SandboxSessionSpec.model_validate(
            {"userId": "u", "egress": {"rules": []}, "network": {"enabled": True}}
        ),
    )
    assert env(build_sandbox_pod(both, settings))["SANDBOX_RUNTIME_NETWORK"] == "allow"
    assert code_env(build_sandbox_pod(both, settings))["HTTP_PROXY"] == "http://10.96.0.9:3128"


@pytest.mark.parametrize("value", ["proxy", "proxy:", "proxy:http", ":3128", "proxy:70000"])
def test_an_egress_proxy_without_host_and_port_is_refused_at_start(value: str):
    with pytest.raises(ValidationError, match="give host:port"):
        OperatorSettings(_env_file=None, egress_proxy=value)


@pytest.mark.parametrize("value", ["proxy:8080", "10.96.0.9:08080", "[fd00::9]:8080"])
def test_an_egress_proxy_on_the_runtimes_own_port_is_refused_at_start(value: str):
    # Code may reach the proxy's port on any address: 8080 would be every runtime's.
    with pytest.raises(ValidationError, match="port 8080 is the sandbox runtime's own"):
        OperatorSettings(_env_file=None, egress_proxy=value)


def test_the_proxy_name_is_resolved_once_to_an_address():
    def resolved(value: str) -> str | None:
        return resolve_egress_proxy(
            OperatorSettings(_env_file=None, egress_proxy=value)
        ).egress_proxy

    assert resolved("localhost:3128") in ("127.0.0.1:3128", "[::1]:3128")
    assert resolved("10.96.0.9:3128") == "10.96.0.9:3128"
    assert resolved("no-such-name.invalid:3128") == "no-such-name.invalid:3128"


# ------------------------------------------------- secrets bound in spec.egress (item 3)
BINDING = {"name": "api", "host": "api.example.com", "secretKeyRef": {"name": "k", "key": "t"}}


def test_a_bound_secret_gives_the_pod_a_placeholder_and_the_proxy_the_same_one():
    settings = OperatorSettings(
        _env_file=None, image="i", egress_proxy="10.96.0.9:3128", egress_ca_configmap="ca"
    )
    egress = {"rules": [{"host": "api.example.com"}], "secrets": [BINDING]}
    body = session("s", egress)
    manifest = build_sandbox_pod(SandboxSession.from_body(body), settings)
    placeholder = code_env(manifest)["SBW_SECRET_API"]
    view = ClusterPolicies()
    view.update([body], [])
    (binding,) = view.lookup("ns/s").bindings_for("api.example.com")
    assert binding.placeholder == placeholder and binding.header == "authorization"
    assert view.secret_ref("ns/s", "api") == SecretRef("ns", "k", "t", "api.example.com")
    assert code_env(manifest)["PIP_CERT"] == EGRESS_CA_BUNDLE
    assert "SBW_SECRET_API" not in env(manifest)  # the runtime process has no use for it
    assert {"name": "egress-ca", "configMap": {"name": "ca"}} in manifest["spec"]["volumes"]
    # Another session's binding of the same name has another placeholder.
    other = build_sandbox_pod(SandboxSession.from_body(session("t", egress)), settings)
    assert code_env(other)["SBW_SECRET_API"] != placeholder
    # A pooled pod may serve it: the claim brings the network and the code's variables
    # (the same ones), and every pool member mounts the CA (optional: the pool does not
    # wait for the proxy to publish it).
    policy_only = SandboxSessionSpec.model_validate(
        {"userId": "u", "egress": egress, "storage": {"persistent": False}}
    )
    assert misfits(policy_only, settings) == []
    egress = claim_egress(SandboxSession.from_body(body), settings)
    assert egress == {"proxy_port": 3128, "code_env": code_env(manifest)}
    pooled = build_pool_pod("ns", settings)
    ca = {"name": "egress-ca", "configMap": {"name": "ca", "optional": True}}
    assert ca in pooled["spec"]["volumes"]
    assert env(pooled)["SANDBOX_RUNTIME_NETWORK"] == "deny"  # until a claim says more
    plain = SandboxSession(name="p", namespace="ns", spec=SandboxSessionSpec(user_id="u"))
    assert claim_egress(plain, settings) is None


@pytest.mark.parametrize(
    ("change", "complaint"),
    [
        ({"env": "SANDBOX_RUNTIME_TOKEN"}, "is the platform's"),
        ({"env": "HTTPS_PROXY"}, "is the platform's"),
        ({"host": "*.example.com"}, "one exact host"),
        ({"header": "host"}, "cannot carry a secret"),
        ({"secretKeyRef": {"name": "Bad_Name", "key": "t"}}, "pattern"),
    ],
)
def test_bad_secret_bindings_are_refused_by_the_model(change: dict, complaint: str):
    with pytest.raises(ValidationError, match=re.escape(complaint)):
        EgressSpec.model_validate({"secrets": [BINDING | change]})
    with pytest.raises(ValidationError, match="own name"):
        EgressSpec.model_validate({"secrets": [BINDING, BINDING]})


def test_a_spec_with_an_invalid_binding_is_no_policy_at_all():
    """The proxy parses raw objects (the apiserver's schema aside): one bad binding makes
    the whole policy invalid — deny all, never a policy without its secrets' checks."""
    view = ClusterPolicies()
    bad = dict(BINDING, secretKeyRef={"name": "k"})
    view.update([session("s", {"rules": [{"host": "api.example.com"}], "secrets": [bad]})], [])
    assert view.lookup("ns/s") is None and view.secret_ref("ns/s", "api") is None


class FakeKube:
    def __init__(self, secret: dict | None) -> None:
        self.secret, self.reads = secret, 0

    async def get(self, path: str) -> dict | None:
        self.reads += 1
        await asyncio.sleep(0.01)
        return self.secret


def platform_secret(labels: dict | None = None, annotations: dict | None = None) -> dict:
    meta = {"labels": {LABEL_EGRESS_SECRET: "true"} if labels is None else labels}
    meta["annotations"] = annotations or {}
    return {"metadata": meta, "data": {"t": base64.b64encode(b"sk-value-123").decode()}}


def test_kube_secret_source_reads_each_secret_once_per_ttl_and_only_the_platforms():
    ref = SecretRef("ns", "k", "t", "api.example.com")

    async def run() -> None:
        kube = FakeKube(platform_secret())
        source = KubeSecretSource(kube, lambda s, n: ref if n == "api" else None, ttl=60)
        values = await asyncio.gather(*(source.value("ns/s", "api") for _ in range(50)))
        assert set(values) == {"sk-value-123"} and kube.reads == 1  # a flood: one read
        assert await source.value("ns/s", "other") is None  # no binding: not read
        for bad, complaint in [
            (platform_secret(labels={}), "is not labelled"),
            (platform_secret(annotations={ANNOTATION_EGRESS_HOSTS: "a.test, b.test"}),
             "may not be sent to api.example.com"),
            (None, "not found"),
        ]:  # fmt: skip
            fresh = KubeSecretSource(FakeKube(bad), lambda s, n: ref)
            with pytest.raises(SecretUnavailable, match=complaint) as caught:
                await fresh.value("ns/s", "api")
            assert "sk-value" not in str(caught.value)
        allowed = platform_secret(annotations={ANNOTATION_EGRESS_HOSTS: "API.example.com"})
        assert await KubeSecretSource(FakeKube(allowed), lambda s, n: ref).value("x", "api")

    asyncio.run(run())
