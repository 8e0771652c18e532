"""Sandbox ids, access tokens and API keys: who an E2B request speaks for.

- A ``sandboxID`` is 20 random hex characters; its conversation is ``e2b-{sandboxID}``
  in the caller's own session (conversation ids are neither globally unique nor DNS
  labels, so the id never is one). Another user naming the same id reaches their own
  session, where it does not exist: 404.
- The ``envdAccessToken`` given at create is ``{b64(json [tenant, user, sandboxID])}.{mac}``
  (HMAC-SHA256 under a key derived from the API's stream-token key): the data plane,
  which receives no API key, learns the caller from it and refuses it for another
  sandbox. Stateless, so every API replica accepts it.
- ``X-API-KEY`` must have E2B's form (``e2b_`` + hex; the JS SDK refuses others). In
  dev auth mode any such key stands for one user, ``e2b-{sha256(key)[:16]}``; in
  ``required`` mode the key must be one issued by ``POST /e2b/keys`` and not revoked
  (``keys``), and stands for its owner.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re
import secrets

from sandbox_workspace.contract.errors import ApiError

from ..identity import Caller

_KEY_FORM = re.compile(r"e2b_[0-9a-f]{8,128}")
_SANDBOX_ID = re.compile(r"[0-9a-f]{20}")
CONVERSATION_PREFIX = "e2b-"
ATTACHED_PREFIX = "conv"  # not hex: never a fresh sandbox's id
_ATTACHED = re.compile(r"conv[a-z2-7]{1,400}")


class E2BUnauthorized(ApiError):
    status = 401
    code = "unauthorized"


class SandboxNotFound(ApiError):
    status = 404
    code = "sandbox_not_found"


def new_sandbox_id() -> str:
    return secrets.token_hex(10)


def check_sandbox_id(sandbox_id: str) -> str:
    """The id as given (E2B SDKs may append ``-{clientID}``; that part is dropped)."""
    sid = sandbox_id.split("-", 1)[0]
    if not (_SANDBOX_ID.fullmatch(sid) or _ATTACHED.fullmatch(sid)):
        raise SandboxNotFound(f"sandbox '{sandbox_id}' not found")
    return sid


def attached_sandbox_id(conversation_id: str) -> str:
    """The sandbox id of an existing conversation the caller attached (``metadata``):
    ``conv`` + the conversation id in lowercase base32, so any replica maps it back with
    no state; it names a conversation only in the caller's own session."""
    raw = base64.b32encode(conversation_id.encode()).decode().rstrip("=").lower()
    return ATTACHED_PREFIX + raw


def is_attached(sandbox_id: str) -> bool:
    return sandbox_id.startswith(ATTACHED_PREFIX)


def conversation_of(sandbox_id: str) -> str:
    if is_attached(sandbox_id):
        raw = sandbox_id.removeprefix(ATTACHED_PREFIX).upper()
        try:
            return base64.b32decode(raw + "=" * (-len(raw) % 8)).decode()
        except ValueError:
            raise SandboxNotFound(f"sandbox '{sandbox_id}' not found") from None
    return CONVERSATION_PREFIX + sandbox_id


def sandbox_of(conversation_id: str) -> str | None:
    """The sandbox id of an E2B-made conversation, None for any other conversation."""
    rest = conversation_id.removeprefix(CONVERSATION_PREFIX)
    if rest != conversation_id and _SANDBOX_ID.fullmatch(rest):
        return rest
    return None


def well_formed_key(key: str | None) -> str:
    if not key or not _KEY_FORM.fullmatch(key):
        raise E2BUnauthorized("send X-API-KEY: e2b_ followed by hex characters (E2B's key form)")
    return key


def dev_caller_for_api_key(key: str) -> Caller:
    return Caller("e2b-" + hashlib.sha256(key.encode()).hexdigest()[:16], "e2b-key")


class AccessTokens:
    """Issue and verify ``envdAccessToken`` values (see the module docstring)."""

    def __init__(self, secret: bytes) -> None:
        self._key = hashlib.sha256(b"e2b-access-token\0" + secret).digest()

    def _mac(self, payload: str) -> str:
        return hmac.new(self._key, payload.encode(), hashlib.sha256).hexdigest()

    def issue(self, caller: Caller, sandbox_id: str) -> str:
        raw = json.dumps([caller.tenant, caller.user_id, sandbox_id]).encode()
        payload = base64.urlsafe_b64encode(raw).decode().rstrip("=")
        return f"{payload}.{self._mac(payload)}"

    def verify(self, token: str | None, sandbox_id: str | None) -> tuple[Caller, str]:
        """The caller and the sandbox id; 401 for a missing, forged or foreign token."""
        if not token or not sandbox_id:
            raise E2BUnauthorized("send X-Access-Token and E2b-Sandbox-Id (as the E2B SDK does)")
        payload, _, mac = token.partition(".")
        if not hmac.compare_digest(mac.encode(), self._mac(payload).encode()):
            raise E2BUnauthorized("invalid X-Access-Token")
        tenant, user, sid = json.loads(
            base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4))
        )
        if sid != check_sandbox_id(sandbox_id):
            raise E2BUnauthorized("the X-Access-Token belongs to another sandbox")
        return Caller(user, "e2b-token", tenant), sid
