"""A pooled runtime (claim key, no token) takes exactly one claim: runtime/claim.py.

Against a real runtime process on 127.0.0.1, started the way the operator's warm pool
starts it (``SANDBOX_RUNTIME_CLAIM_KEY`` and no ``SANDBOX_RUNTIME_TOKEN``).
"""

from __future__ import annotations

import secrets
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime

import httpx
import pytest

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
    assert (r.status_code, r.json()) == (200, {"claimed": True})
    ok = httpx.get(url + "/v1/stats", headers={"Authorization": f"Bearer {token}"})
    assert ok.status_code == 200, ok.text
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
    assert not settings.pooled and state.claim.token == "t" * 20
    assert state.claim.claim_key is None
