"""The caller's tenant (seed 003's /api/tenants/{tenant_id}/… routes): a JWT claim, else
X-Tenant-Id beside the service token or in dev mode, else ``default``."""

from __future__ import annotations

import asyncio
import os
import time

import jwt
import pytest
from starlette.datastructures import Headers

from sandbox_workspace.api.identity import Authenticator
from sandbox_workspace.api.settings import ApiSettings
from sandbox_workspace.contract.errors import BadRequest

SECRET = "s" * 32
TOKEN = "service-token-0123456789"
NAMES = {"aud": "sandbox", "iss": "https://id.example"}  # the API's own (settings below)


@pytest.fixture(autouse=True)
def no_settings_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """ApiSettings reads SANDBOX_WORKSPACE_*: another test's leftovers must not count."""
    for key in list(os.environ):
        if key.startswith("SANDBOX_WORKSPACE_"):
            monkeypatch.delenv(key)


def authenticate(headers: dict, **settings) -> tuple[str, str]:
    values = {
        "auth_mode": "required",
        "jwt_secret": SECRET,
        "service_token": TOKEN,
        "jwt_audience": NAMES["aud"],
        "jwt_issuer": NAMES["iss"],
    }
    authenticator = Authenticator(ApiSettings(**values, **settings))
    caller = asyncio.run(authenticator.authenticate(Headers(headers)))
    return caller.user_id, caller.tenant


class Bearer(dict):
    """A JWT's claims, signed only when the test runs: a token made at collection would
    expire before a long suite reaches the test (it did, 23 minutes in)."""

    def __or__(self, other: dict) -> Bearer:
        return Bearer({**self, "_extra": {**self.get("_extra", {}), **other}})

    def headers(self) -> dict:
        claims = {k: v for k, v in self.items() if k != "_extra"}
        claims = {"exp": int(time.time()) + 600, **NAMES, **claims}
        token = jwt.encode(claims, SECRET, algorithm="HS256")
        return {"authorization": f"Bearer {token}", **self.get("_extra", {})}


def bearer(**claims) -> Bearer:
    return Bearer(claims)


@pytest.mark.parametrize(
    ("headers", "settings", "expected"),
    [
        pytest.param(bearer(sub="u", tenant_id="acme"), {}, ("u", "acme"), id="jwt-claim"),
        pytest.param(bearer(sub="u"), {}, ("u", "default"), id="jwt-without-claim"),
        pytest.param(
            bearer(sub="u", org="beta"), {"jwt_tenant_claim": "org"}, ("u", "beta"), id="claim"
        ),
        pytest.param(
            bearer(sub="u", tenant_id="acme") | {"x-tenant-id": "forged"},
            {},
            ("u", "acme"),
            id="jwt-ignores-header",
        ),
        pytest.param(
            {"authorization": f"Bearer {TOKEN}", "x-user-id": "u", "x-tenant-id": "acme"},
            {},
            ("u", "acme"),
            id="service-token-header",
        ),
        pytest.param(
            {"authorization": f"Bearer {TOKEN}", "x-user-id": "u"},
            {},
            ("u", "default"),
            id="service-token-default",
        ),
    ],
)
def test_tenant_of_the_caller(headers, settings, expected):
    if isinstance(headers, Bearer):
        headers = headers.headers()
    assert authenticate(headers, **settings) == expected


def test_a_tenant_id_with_a_slash_is_refused():
    with pytest.raises(BadRequest, match="tenant id"):
        authenticate({"authorization": f"Bearer {TOKEN}", "x-user-id": "u", "x-tenant-id": "a/b"})
