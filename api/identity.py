"""Who is calling: a ``Caller`` from the request's credentials.

Contract (DESIGN "Identity and isolation"):
- ``dev`` mode: no credentials; the user is ``X-User-Id`` or ``dev``.
- ``required`` mode: ``Authorization: Bearer <service token>`` plus ``X-User-Id`` (the
  platform backend speaking for a user), or ``Bearer <JWT>`` whose ``sub`` is the user
  (HS256 with a shared secret, or keys from a JWKS URL). Anything else is 401.
- A JWT must name this API: ``iss`` and ``aud`` are required and checked (settings refuse
  JWT configuration without them), with ``jwt_leeway_seconds`` of clock skew allowed.
- ``authenticate`` runs on the event loop: the service token, HS256 and JWKS keys held
  are checked with no I/O and no thread hop; only a due JWKS refresh leaves the loop
  (``jwks.JwksKeys``: rate-limited, unknown kids remembered).
User ids must be 1–128 printable characters without ``/`` or ``\\`` (they become part of
``sb-session-{user_id}`` in URLs).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
import unicodedata
from dataclasses import dataclass

import jwt
from starlette.datastructures import Headers

from sandbox_workspace.contract.errors import ApiError, BadRequest, Unauthorized
from sandbox_workspace.operator.naming import session_id_for

from .jwks import JwksKeys
from .settings import ApiSettings

DEV_USER = "dev"
MAX_USER_ID = 128


class Forbidden(ApiError):
    """The request is well-formed but asks for something that is not the caller's."""

    status, code = 403, "forbidden"


DEFAULT_TENANT = "default"


@dataclass(frozen=True)
class Caller:
    user_id: str
    via: str  # "dev", "service-token" or "jwt"
    # The platform tenant the caller acts in: the JWT's tenant claim
    # (SANDBOX_WORKSPACE_JWT_TENANT_CLAIM), else X-Tenant-Id (dev, service token), else
    # "default". Seed 003's /api/tenants/{tenant_id}/… routes answer 404 for another one.
    tenant: str = DEFAULT_TENANT

    @property
    def session_id(self) -> str:
        """The caller's one session: ``sb-session-{user_id}`` in the default tenant, one
        per (tenant, user) in any other (``naming.session_id_for``)."""
        return session_id_for(self.user_id, self.tenant)


def check_tenant(tenant: str | None) -> str:
    if tenant is None or tenant == "":
        return DEFAULT_TENANT
    try:
        return check_user_id(tenant)  # the same rules: printable, no '/' or '\\'
    except BadRequest as e:
        raise BadRequest(
            e.message.replace("user id", "tenant id"), code="invalid_tenant_id"
        ) from None


def check_user_id(user_id: str) -> str:
    if not 0 < len(user_id) <= MAX_USER_ID:
        raise BadRequest(f"user id must be 1-{MAX_USER_ID} characters", code="invalid_user_id")
    if any(c in "/\\" or (unicodedata.category(c)[0] in "CZ" and c != " ") for c in user_id) or (
        user_id.strip() != user_id
    ):
        raise BadRequest(
            "user id must be printable, without '/', '\\' or surrounding spaces",
            code="invalid_user_id",
        )
    return user_id


class Authenticator:
    def __init__(self, settings: ApiSettings) -> None:
        self.settings = settings
        self._jwks = (
            JwksKeys(
                settings.jwt_jwks_url, min_refresh_seconds=settings.jwt_jwks_min_refresh_seconds
            )
            if settings.jwt_jwks_url
            else None
        )

    async def authenticate(self, headers: Headers) -> Caller:
        s = self.settings
        if s.auth_mode == "dev":
            return Caller(
                check_user_id(headers.get("x-user-id") or DEV_USER),
                "dev",
                check_tenant(headers.get("x-tenant-id")),
            )
        scheme, _, token = (headers.get("authorization") or "").partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise Unauthorized("send Authorization: Bearer <service token or JWT>")
        if s.service_token is not None and hmac.compare_digest(
            token.encode(), s.service_token.get_secret_value().encode()
        ):
            user = headers.get("x-user-id")
            if not user:
                raise BadRequest(
                    "the service token must come with an X-User-Id header", code="missing_user_id"
                )
            return Caller(
                check_user_id(user), "service-token", check_tenant(headers.get("x-tenant-id"))
            )
        if s.jwt_secret is None and self._jwks is None:
            raise Unauthorized("invalid bearer token")
        claims = await self._verify_jwt(token)
        tenant = claims.get(s.jwt_tenant_claim)
        return Caller(
            check_user_id(claims["sub"]),
            "jwt",
            check_tenant(tenant if isinstance(tenant, str) else None),
        )

    async def _verify_jwt(self, token: str) -> dict:
        s = self.settings
        checks = {
            "audience": s.jwt_audience,
            "issuer": s.jwt_issuer,
            "leeway": s.jwt_leeway_seconds,
            "options": {"require": ["sub", "exp", "iss", "aud"]},
        }
        try:
            header = jwt.get_unverified_header(token)
            if s.jwt_secret is not None and header.get("alg") == "HS256":
                key, algorithms = s.jwt_secret.get_secret_value(), ["HS256"]
            elif self._jwks is not None:
                kid = header.get("kid")
                key, algorithms = (await self._jwks.key(kid)).key, ["RS256", "ES256", "EdDSA"]
            else:
                raise Unauthorized("JWT must be signed with HS256")
            claims = jwt.decode(token, key, algorithms=algorithms, **checks)
        except jwt.PyJWTError as e:
            raise Unauthorized(f"invalid JWT: {e}") from e
        sub = claims.get("sub")
        if not isinstance(sub, str) or not sub:
            raise Unauthorized("JWT has no 'sub' claim")
        return claims


class StreamTokens:
    """Short-lived, run-scoped bearer tokens for ``GET /runs/{id}/events?token=…``.

    A browser's ``EventSource`` cannot send an ``Authorization`` header, so a client that
    is authenticated asks ``POST /runs/{id}/stream-token`` and puts the answer in the URL.
    A token names one run, one user and the user's tenant (a user id may repeat across
    tenants; runs are the session's) and expires after ``ttl`` seconds; it is an HMAC
    over those, so any replica sharing the key verifies it without shared state. It grants
    nothing but reading that run's events.
    """

    def __init__(self, key: bytes, ttl: int) -> None:
        self.key = key
        self.ttl = ttl

    def _mac(self, payload: bytes) -> str:
        digest = hmac.new(self.key, payload, hashlib.sha256).digest()
        return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()

    def issue(
        self, run_id: str, user_id: str, now: float | None = None, tenant: str = DEFAULT_TENANT
    ) -> tuple[str, int]:
        """A token for ``run_id`` and its expiry (Unix seconds)."""
        expires = int((time.time() if now is None else now) + self.ttl)
        payload = json.dumps([run_id, user_id, expires, tenant], separators=(",", ":")).encode()
        body = base64.urlsafe_b64encode(payload).rstrip(b"=").decode()
        return f"{body}.{self._mac(payload)}", expires

    def verify(self, token: str, run_id: str, now: float | None = None) -> Caller:
        """The caller the token speaks for, or ``Unauthorized`` saying why not."""
        body, _, mac = token.partition(".")
        try:
            payload = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
            # Three fields: a token from before tenants were in it (the default tenant's).
            token_run, user, expires, *tenant = json.loads(payload)
        except (ValueError, TypeError):
            raise Unauthorized("malformed stream token") from None
        # As bytes: compare_digest refuses a str with non-ASCII characters (a TypeError,
        # which was a 500 for a client's malformed token).
        if not hmac.compare_digest(mac.encode(), self._mac(payload).encode()):
            raise Unauthorized("invalid stream token")
        if token_run != run_id:
            raise Unauthorized("this stream token is for another run")
        if (time.time() if now is None else now) > expires:
            raise Unauthorized("stream token expired; ask POST /runs/{run_id}/stream-token again")
        return Caller(str(user), "stream-token", str(tenant[0]) if tenant else DEFAULT_TENANT)
