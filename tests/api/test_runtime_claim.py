"""A pooled runtime (claim key, no token) takes exactly one claim: runtime/claim.py.

Against a real runtime process on 127.0.0.1, started the way the operator's warm pool
starts it (``SANDBOX_RUNTIME_CLAIM_KEY`` and no ``SANDBOX_RUNTIME_TOKEN``).
"""

from __future__ import annotations

import asyncio
import secrets
import socket
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime

import httpx
import pytest
from hostile_code import connect_probe

from sandbox_workspace.runtime import landlock

KEY = secrets.token_urlsafe(24)


@pytest.fixture
def runtime_env() -> dict[str, str]:
    return {"SANDBOX_RUNTIME_TOKEN": "", "SANDBOX_RUNTIME_CLAIM_KEY": KEY}


def _claim(url: str, token: str, key: str | None = KEY) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key is not None else {}
    return httpx.post(url + "/v1/claim", json={"token": token}, headers=headers)


def test_unclaimed_runtime_answers_health_only(runtime):
    url = runtime.server.url
    assert httpx.get(url + "/healthz").status_code == 200
    for headers in ({}, {"Authorization": f"Bearer {KEY}"}, {"Authorization": "Bearer x"}):
        r = httpx.get(url + "/v1/stats", headers=headers)
        assert r.status_code == 401, r.text
        assert r.json()["error"]["code"] == "unauthorized"


def test_one_claim_then_only_its_token(runtime):
    url, token = runtime.server.url, secrets.token_urlsafe(32)
    assert _claim(url, token, key=None).status_code == 401
    assert _claim(url, token, key="not-the-key").status_code == 401
    assert _claim(url, "short").status_code == 422
    r = _claim(url, token)
    ok = httpx.get(url + "/v1/stats", headers={"Authorization": f"Bearer {token}"})
    assert ok.status_code == 200, ok.text
    # The answer names the workspace root as its stats do (the session's status records
    # it: the API's first command asks no stats for it).
    path = ok.json()["workspace_path"]
    assert (r.status_code, r.json()) == (
        200,
        {"claimed": True, "network": "deny", "workspace_path": path},
    )
    # The claim key is no token; a second claim with another token is refused.
    assert (
        httpx.get(url + "/v1/stats", headers={"Authorization": f"Bearer {KEY}"}).status_code == 401
    )
    again = _claim(url, secrets.token_urlsafe(32))
    assert again.status_code == 409 and again.json()["error"]["code"] == "already_claimed"
    # The same claim repeated (the operator retrying) answers as the first did.
    assert _claim(url, token).status_code == 200
    assert runtime.upload("c1", "a.csv", b"1").status_code == 401  # the fixture's token
    r = httpx.put(url + "/v1/conversations/c1", headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == 200


def test_a_claim_is_activity_the_pools_wait_is_not(runtime):
    """The idle deadline of a session on a pooled pod counts from the claim (a pod may
    wait in the pool longer than the session's idle timeout)."""
    url, token = runtime.server.url, secrets.token_urlsafe(32)
    before = datetime.now(UTC)
    assert _claim(url, token).status_code == 200
    stats = httpx.get(url + "/v1/stats", headers={"Authorization": f"Bearer {token}"}).json()
    assert datetime.fromisoformat(stats["started_at"]) < before  # the pod waited...
    assert datetime.fromisoformat(stats["last_activity_at"]) >= before  # ...not the session


def test_racing_claims_have_one_winner(runtime):
    url = runtime.server.url
    tokens = [secrets.token_urlsafe(32) for _ in range(16)]
    with ThreadPoolExecutor(16) as pool:
        codes = list(pool.map(lambda t: _claim(url, t).status_code, tokens))
    assert sorted(codes) == [200] + [409] * 15
    winner = tokens[codes.index(200)]
    for token in tokens:
        r = httpx.get(url + "/v1/stats", headers={"Authorization": f"Bearer {token}"})
        assert r.status_code == (200 if token == winner else 401)


def test_a_runtime_with_a_token_takes_no_claim(tmp_path):
    from sandbox_workspace.runtime.app import create_app
    from sandbox_workspace.runtime.settings import RuntimeSettings

    settings = RuntimeSettings(token="t" * 20, claim_key=KEY, root=tmp_path)
    state = create_app(settings).state.runtime
    asyncio.run(state.executor.aclose())  # no lifespan ran: its scratch root goes here
    assert not settings.pooled and state.claim.token == "t" * 20
    assert state.claim.claim_key is None


# Code's view of its network after the claim: the egress port, not another.
NETWORK_SEEN = connect_probe("PROXY_PORT", "OTHER_PORT")


@pytest.mark.skipif(landlock.abi_version() < 4, reason="Landlock TCP rules need ABI 4")
def test_a_claim_with_egress_gives_code_the_proxy_port_alone_once(runtime):
    """A pooled runtime (network deny) claimed for a session with an egress policy: its
    code reaches the proxy's port and no other, and sees the claim's variables; the same
    claim again is the same answer, another egress is refused (the network of code that
    may have run never changes), and so is one after code ran."""
    servers = [socket.create_server(("127.0.0.1", 0)) for _ in range(2)]
    proxy, other = (s.getsockname()[1] for s in servers)
    url, token = runtime.server.url, secrets.token_urlsafe(32)
    egress = {"proxy_port": proxy, "code_env": {"PROXY_PORT": str(proxy), "OTHER_PORT": str(other)}}
    auth = {"Authorization": f"Bearer {KEY}"}
    try:
        bad = {"proxy_port": proxy, "code_env": {"A=B": "x"}}
        r = httpx.post(url + "/v1/claim", json={"token": token, "egress": bad}, headers=auth)
        assert r.status_code == 422 and "not an environment variable name" in r.text
        body = {"token": token, "egress": egress}
        r = httpx.post(url + "/v1/claim", json=body, headers=auth)
        assert r.status_code == 200
        assert (r.json()["claimed"], r.json()["network"]) == (True, "proxy_port")
        assert httpx.post(url + "/v1/claim", json=body, headers=auth).status_code == 200
        other_egress = {"token": token, "egress": {"proxy_port": other}}
        r = httpx.post(url + "/v1/claim", json=other_egress, headers=auth)
        assert r.status_code == 409 and "cannot take the claim's egress" in r.text
        ran = httpx.post(
            url + "/v1/conversations/c/execute",
            json={"language": "python", "code": NETWORK_SEEN, "timeout": 30},
            headers={"Authorization": f"Bearer {token}"},
        ).json()
        assert ran["stdout"] == "made EACCES\n", ran
    finally:
        for s in servers:
            s.close()


def test_a_claim_with_egress_is_refused_once_code_ran(runtime):
    url, token = runtime.server.url, secrets.token_urlsafe(32)
    assert _claim(url, token).status_code == 200
    ran = httpx.post(
        url + "/v1/conversations/c/execute",
        json={"language": "bash", "code": "true", "timeout": 30},
        headers={"Authorization": f"Bearer {token}"},
    )
    assert ran.status_code == 200
    body = {"token": token, "egress": {"proxy_port": 3128}}
    r = httpx.post(url + "/v1/claim", json=body, headers={"Authorization": f"Bearer {KEY}"})
    assert r.status_code == 409 and "code ran already" in r.text
