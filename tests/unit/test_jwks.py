"""JWKS keys (api/jwks.py) and JWT checks (api/identity.py), against a JWKS served on
loopback that counts its fetches: made-up key ids cost at most one fetch per interval
and no thread each; a rotated key is picked up after it; the service token never waits
for the IdP; ``iss`` and ``aud`` are required, with 30 s of clock leeway."""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from starlette.datastructures import Headers

from sandbox_workspace.api.identity import Authenticator
from sandbox_workspace.api.jwks import JwksKeys
from sandbox_workspace.api.settings import ApiSettings
from sandbox_workspace.contract.errors import Unauthorized

AUD, ISS = "sandbox", "https://id.example"
TOKEN = "service-token-0123456789"


@pytest.fixture(autouse=True)
def no_settings_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.startswith("SANDBOX_WORKSPACE_"):
            monkeypatch.delenv(key)


class Idp:
    """A JWKS endpoint: its keys, how often it was fetched, an optional delay."""

    def __init__(self) -> None:
        self.keys: dict[str, rsa.RSAPrivateKey] = {}
        self.fetches = 0
        self.delay = 0.0
        idp = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                idp.fetches += 1
                time.sleep(idp.delay)
                body = json.dumps({"keys": [idp.jwk(k) for k in idp.keys]}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_port}/jwks.json"

    def jwk(self, kid: str) -> dict:
        jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(self.keys[kid].public_key()))
        return {**jwk, "kid": kid, "alg": "RS256", "use": "sig"}

    def add(self, kid: str) -> None:
        self.keys[kid] = rsa.generate_private_key(public_exponent=65537, key_size=2048)

    def token(self, kid: str, key: str | None = None, **claims) -> str:
        claims = {"sub": "u", "aud": AUD, "iss": ISS, "exp": int(time.time()) + 300, **claims}
        return jwt.encode(claims, self.keys[key or kid], algorithm="RS256", headers={"kid": kid})


@pytest.fixture
def idp():
    server = Idp()
    server.add("k1")
    yield server
    server.server.shutdown()


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_made_up_kids_cost_one_fetch_per_interval_and_a_rotated_key_is_picked_up(idp):
    clock = Clock()
    keys = JwksKeys(idp.url, min_refresh_seconds=30, clock=clock)

    async def scenario():
        assert (await keys.key("k1")).key_id == "k1"
        assert idp.fetches == 1
        await keys.key("k1")  # held: no I/O
        kids = [uuid.uuid4().hex for _ in range(200)]
        results = await asyncio.gather(*(keys.key(k) for k in kids), return_exceptions=True)
        assert all(isinstance(r, Unauthorized) for r in results)
        assert idp.fetches == 1, "unknown kids within the interval fetch nothing"
        idp.add("k2")  # the IdP rotates
        with pytest.raises(Unauthorized):
            await keys.key("k2")  # not yet: the last fetch is recent
        clock.now += 31
        assert (await keys.key("k2")).key_id == "k2"
        assert idp.fetches == 2
        with pytest.raises(Unauthorized):
            await keys.key(kids[0])  # still unknown after the new set: remembered
        assert idp.fetches == 2

    asyncio.run(scenario())


def authenticator(idp, **settings) -> Authenticator:
    values = {
        "auth_mode": "required",
        "service_token": TOKEN,
        "jwt_jwks_url": idp.url,
        "jwt_audience": AUD,
        "jwt_issuer": ISS,
    }
    return Authenticator(ApiSettings(**values | settings))


def bearer(token: str) -> Headers:
    return Headers({"authorization": f"Bearer {token}"})


def test_the_service_token_never_waits_for_the_idp(idp):
    idp.delay = 6.0  # an IdP that answers slowly (margin for a busy shared machine)
    auth = authenticator(idp)
    service = Headers({"authorization": f"Bearer {TOKEN}", "x-user-id": "svc"})

    async def scenario():
        floods = [
            asyncio.create_task(auth.authenticate(bearer(idp.token(uuid.uuid4().hex, "k1"))))
            for _ in range(50)
        ]
        await asyncio.sleep(0.2)  # the one fetch is under way
        started = time.monotonic()
        assert (await auth.authenticate(service)).user_id == "svc"
        waited = time.monotonic() - started
        assert waited < idp.delay / 2, f"the service token waited {waited:.1f}s for the IdP"
        results = await asyncio.gather(*floods, return_exceptions=True)
        assert all(isinstance(r, Unauthorized) for r in results)
        assert idp.fetches == 1

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("claims", "accepted"),
    [
        pytest.param({}, True, id="ok"),
        pytest.param({"aud": "other-app"}, False, id="another-apps-audience"),
        pytest.param({"iss": "https://elsewhere"}, False, id="another-issuer"),
        pytest.param({"aud": None}, False, id="no-aud"),
        pytest.param({"iss": None}, False, id="no-iss"),
        # Times as offsets from now (a time fixed at collection goes stale in a long run).
        pytest.param({"exp": -10}, True, id="expired-within-leeway"),
        pytest.param({"exp": -60}, False, id="expired-past-leeway"),
        pytest.param({"nbf": 10}, True, id="early-within-leeway"),
        pytest.param({"nbf": 60}, False, id="early-past-leeway"),
    ],
)
def test_a_jwt_must_name_this_api_with_some_leeway_on_time(idp, claims, accepted):
    now = int(time.time())
    claims = {k: now + v if k in ("exp", "nbf") else v for k, v in claims.items()}
    token = idp.token("k1", **{k: v for k, v in claims.items() if v is not None})
    if any(v is None for v in claims.values()):
        payload = jwt.decode(token, options={"verify_signature": False})
        for k in [k for k, v in claims.items() if v is None]:
            payload.pop(k)
        token = jwt.encode(payload, idp.keys["k1"], algorithm="RS256", headers={"kid": "k1"})
    auth = authenticator(idp)
    if accepted:
        assert asyncio.run(auth.authenticate(bearer(token))).user_id == "u"
    else:
        with pytest.raises(Unauthorized):
            asyncio.run(auth.authenticate(bearer(token)))


@pytest.mark.parametrize(
    "settings",
    [
        pytest.param({"jwt_secret": "s" * 32}, id="hs256"),
        pytest.param({"jwt_jwks_url": "https://id.example/jwks"}, id="jwks"),
        pytest.param({"jwt_secret": "s" * 32, "jwt_audience": AUD}, id="no-issuer"),
        pytest.param({"jwt_secret": "s" * 32, "jwt_issuer": ISS}, id="no-audience"),
    ],
)
def test_jwt_settings_without_audience_and_issuer_are_refused(settings):
    with pytest.raises(ValueError, match="needs SANDBOX_WORKSPACE_JWT_AUDIENCE"):
        ApiSettings(auth_mode="required", **settings)
