"""Identity: service token + X-User-Id, HS256 and JWKS JWTs, and the dev-mode guard rails."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, HTTPServer

import httpx
import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa

SERVICE_TOKEN = "service-token-0123456789abcdef"
JWT_SECRET = "jwt-secret-0123456789abcdef-0123456789"
AUDIENCE, ISSUER = "sandbox-workspace", "https://id.example.internal"


def hs256(sub: str, *, secret: str = JWT_SECRET, expires_in: float = 300, **claims) -> str:
    payload = {
        "sub": sub,
        "exp": int(time.time() + expires_in),
        "aud": AUDIENCE,
        "iss": ISSUER,
        **claims,
    }
    return jwt.encode(payload, secret, algorithm="HS256")


@pytest.fixture(scope="module")
def secure_api(start_server):
    return start_server(
        "api",
        SANDBOX_WORKSPACE_AUTH_MODE="required",
        SANDBOX_WORKSPACE_SERVICE_TOKEN=SERVICE_TOKEN,
        SANDBOX_WORKSPACE_JWT_SECRET=JWT_SECRET,
        SANDBOX_WORKSPACE_JWT_AUDIENCE=AUDIENCE,
        SANDBOX_WORKSPACE_JWT_ISSUER=ISSUER,
        SANDBOX_WORKSPACE_DATA_DIR="data",
    )


def get(server, path: str, **headers: str) -> httpx.Response:
    return httpx.get(server.url + path, headers=headers, timeout=30)


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        pytest.param({}, 401, id="no-credentials"),
        pytest.param({"X-User-Id": "alice"}, 401, id="user-header-alone-is-not-auth"),
        pytest.param({"Authorization": "Bearer wrong-token"}, 401, id="wrong-token"),
        pytest.param({"Authorization": f"Basic {SERVICE_TOKEN}"}, 401, id="wrong-scheme"),
        pytest.param(
            {"Authorization": f"Bearer {SERVICE_TOKEN}"}, 400, id="service-token-without-user"
        ),
        pytest.param(
            {"Authorization": f"Bearer {hs256('alice', expires_in=-60)}"}, 401, id="expired-jwt"
        ),
        pytest.param(
            {"Authorization": f"Bearer {hs256('alice', secret='x' * 40)}"}, 401, id="jwt-wrong-key"
        ),
        pytest.param(
            {
                "Authorization": "Bearer "
                + jwt.encode(
                    {"sub": "alice", "exp": int(time.time()) + 300}, key="", algorithm="none"
                )
            },
            401,
            id="jwt-alg-none",
        ),
    ],
)
def test_refused_credentials(secure_api, headers, status):
    r = get(secure_api, "/api/v1/sessions/sb-session-alice", **headers)
    assert r.status_code == status, r.text
    assert r.json()["error"]["message"]
    if status == 401:
        assert r.headers["www-authenticate"] == "Bearer"


def test_service_token_speaks_for_the_user(secure_api):
    auth = {"Authorization": f"Bearer {SERVICE_TOKEN}", "X-User-Id": "svc-user"}
    r = httpx.post(secure_api.url + "/api/v1/sessions", headers=auth, json={}, timeout=30)
    assert r.status_code == 201 and r.json()["user_id"] == "svc-user"
    assert get(secure_api, "/api/v1/sessions/sb-session-svc-user", **auth).status_code == 200
    other = {**auth, "X-User-Id": "someone-else"}
    assert get(secure_api, "/api/v1/sessions/sb-session-svc-user", **other).status_code == 404


def test_jwt_sub_is_the_user_and_x_user_id_cannot_override_it(secure_api):
    token = hs256("jwt-user")
    auth = {"Authorization": f"Bearer {token}", "X-User-Id": "impostor"}
    r = httpx.post(secure_api.url + "/api/v1/sessions", headers=auth, json={}, timeout=30)
    assert r.status_code == 201 and r.json()["session_id"] == "sb-session-jwt-user"
    assert get(secure_api, "/api/v1/sessions/sb-session-impostor", **auth).status_code == 404


def test_invalid_user_id_is_400(secure_api):
    auth = {"Authorization": f"Bearer {SERVICE_TOKEN}", "X-User-Id": "a/b"}
    r = get(secure_api, "/api/v1/sessions/sb-session-a", **auth)
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_user_id"


def test_health_needs_no_credentials(secure_api):
    assert get(secure_api, "/healthz").status_code == 200


class _Jwks(BaseHTTPRequestHandler):
    body = b"{}"

    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args):
        pass


def jwks_api(start_server, jwks: HTTPServer, audience: str = AUDIENCE, **env: str):
    """A ``required`` API verifying JWTs with the keys ``jwks`` serves."""
    return start_server(
        "api",
        SANDBOX_WORKSPACE_AUTH_MODE="required",
        SANDBOX_WORKSPACE_DATA_DIR="data",
        SANDBOX_WORKSPACE_JWT_JWKS_URL=f"http://127.0.0.1:{jwks.server_port}/jwks.json",
        SANDBOX_WORKSPACE_JWT_AUDIENCE=audience,
        SANDBOX_WORKSPACE_JWT_ISSUER=ISSUER,
        **env,
    )


def test_jwks_signed_jwt(start_server):
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(key.public_key()))
    jwk.update(kid="k1", alg="RS256", use="sig")
    handler = type("Handler", (_Jwks,), {"body": json.dumps({"keys": [jwk]}).encode()})
    jwks = HTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=jwks.serve_forever, daemon=True).start()
    try:
        server = jwks_api(start_server, jwks, audience="sandbox")
        claims = {"sub": "rs-user", "aud": "sandbox", "iss": ISSUER, "exp": int(time.time()) + 300}
        good = jwt.encode(claims, key, algorithm="RS256", headers={"kid": "k1"})
        r = get(server, "/api/v1/sessions/sb-session-rs-user", Authorization=f"Bearer {good}")
        assert r.status_code == 404  # authenticated; the session simply does not exist yet
        wrong_aud = jwt.encode(
            {**claims, "aud": "other"}, key, algorithm="RS256", headers={"kid": "k1"}
        )
        r = get(server, "/api/v1/sessions/sb-session-rs-user", Authorization=f"Bearer {wrong_aud}")
        assert r.status_code == 401
    finally:
        jwks.shutdown()


IDP_DELAY = 8.0  # seconds; a busy shared machine answers the service token in ~2 s


def test_made_up_key_ids_neither_hammer_the_idp_nor_stall_the_service_token(start_server):
    """Security review M1's probe: parallel requests with random kids while the IdP is
    slow; a service-token request meanwhile answers at once, and the IdP saw one fetch."""
    hits = []

    class Slow(_Jwks):
        body = json.dumps({"keys": []}).encode()

        def do_GET(self):
            hits.append(time.monotonic())
            time.sleep(IDP_DELAY)
            super().do_GET()

    from http.server import ThreadingHTTPServer

    jwks = ThreadingHTTPServer(("127.0.0.1", 0), Slow)
    threading.Thread(target=jwks.serve_forever, daemon=True).start()
    try:
        server = jwks_api(start_server, jwks, SANDBOX_WORKSPACE_SERVICE_TOKEN=SERVICE_TOKEN)

        def forged() -> str:
            header = {"alg": "RS256", "kid": os.urandom(8).hex()}
            part = base64.urlsafe_b64encode(json.dumps(header).encode()).rstrip(b"=").decode()
            return f"Bearer {part}.e30.eA"  # ".x" fails to decode before any key look-up

        url = server.url + "/api/v1/sessions/sb-session-svc"
        with ThreadPoolExecutor(64) as pool:
            flood = [pool.submit(httpx.get, url, headers={"Authorization": forged()}, timeout=60)
                     for _ in range(200)]  # fmt: skip
            time.sleep(0.5)  # the one fetch is under way
            started = time.monotonic()
            auth = {"Authorization": f"Bearer {SERVICE_TOKEN}", "X-User-Id": "svc"}
            assert get(server, "/api/v1/sessions/sb-session-svc", **auth).status_code == 404
            waited = time.monotonic() - started
            assert waited < IDP_DELAY / 2, f"the service token waited {waited:.1f}s for the IdP"
            assert {f.result().status_code for f in flood} == {401}
        assert len(hits) == 1, f"{len(hits)} JWKS fetches"
    finally:
        jwks.shutdown()


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        pytest.param(
            ["dev", "--host", "0.0.0.0"],
            {},
            "only allowed on a loopback host",
            id="dev-off-loopback",
        ),
        pytest.param(
            ["api"],
            {"SANDBOX_WORKSPACE_AUTH_MODE": "required"},
            "needs SANDBOX_WORKSPACE_SERVICE_TOKEN",
            id="required-without-credential",
        ),
        pytest.param(
            ["api"],
            {"SANDBOX_WORKSPACE_SERVICE_TOKEN": "short"},
            "at least 16 characters",
            id="weak-service-token",
        ),
        pytest.param(
            ["api"],
            {"SANDBOX_WORKSPACE_JWT_JWKS_URL": "https://id.example/jwks.json"},
            "needs SANDBOX_WORKSPACE_JWT_AUDIENCE and SANDBOX_WORKSPACE_JWT_ISSUER",
            id="jwt-without-audience-and-issuer",
        ),
    ],
)
def test_unsafe_settings_refuse_to_start(argv, env, message, tmp_path):
    clean = {"PATH": "/usr/bin:/bin", **env}
    result = subprocess.run(
        [sys.executable, "-m", "sandbox_workspace", *argv],
        env=clean,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert message in result.stderr
