"""A pooled runtime's one claim: how a ready sandbox pod learns whose it is.

Contract: a runtime started with a claim key and no token (``RuntimeSettings.pooled``,
the operator's warm pool) answers ``/healthz`` and nothing else until it is claimed:
every other route is 401. ``POST /v1/claim`` with ``Authorization: Bearer <claim key>``
and ``{"token": ...}`` sets the bearer token, once: from then on only that token works.
Repeating the same claim answers 200 again (the operator may not know whether its first
attempt arrived); a claim with any other token is 409 — a pod serves one session in its
whole life. A wrong or missing claim key is 401; a runtime that is not pooled answers 404.

With ``egress`` (a session with an egress policy, ``operator/pool/spec.claim_egress``) the
claim also sets its code's network to ``proxy_port`` at ``egress.proxy_port`` and adds
``egress.code_env`` to its code's environment — before any code ran, since nothing runs
unclaimed; the answer's ``network`` says what code has (a runtime that answers without it
did not take the egress). Only the pooled network, ``deny``, may be set so, once; the same
egress again is the same claim (200), another is 409.

Every claim's answer names ``workspace_path``, the workspace root as code sees it (what
``GET /v1/stats`` says): the operator records it in the session's status, so the API's
first command needs no ``GET /v1/stats`` to learn it (issue 39).

Who may claim: whoever holds the claim key — the operator, which keeps it in a Secret of
the namespace (``operator/pool``). The key reaches the runtime through its environment,
which the CLI scrubs before serving and executed code never inherits, exactly like the
token of a cold pod.
"""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import Header
from pydantic import BaseModel, Field, field_validator

from sandbox_workspace.contract.errors import Conflict, NotFoundError, Unauthorized

from .settings import check_code_env


class ClaimEgress(BaseModel):
    proxy_port: int = Field(ge=1, le=65535, description="The egress proxy's port.")
    code_env: dict[str, str] = Field(
        default_factory=dict, description="Variables the session's code sees."
    )

    _names = field_validator("code_env")(check_code_env)


class ClaimRequest(BaseModel):
    token: str = Field(
        min_length=16, max_length=512, description="The session's bearer token from now on."
    )
    egress: ClaimEgress | None = Field(None, description="Its code's network, if a policy.")


class Claimed(BaseModel):
    claimed: bool = True
    network: str = Field(description="The network of this runtime's code now.")
    workspace_path: str = Field(
        description="The workspace root as code sees it (the operator records it in the "
        "session's status: the API need not ask `GET /v1/stats` for it)."
    )


def _same(a: str, b: str) -> bool:
    return hmac.compare_digest(a.encode(), b.encode())


class ClaimState:
    """The token of a runtime, and for a pooled one, the key that may set it once."""

    def __init__(self, token: str | None, claim_key: str | None) -> None:
        self.token = token
        self.claim_key = claim_key if token is None else None

    def claim(self, authorization: str | None, token: str) -> bool:
        """Check the claim; True when it is the first (the token is set), False when it
        repeats the claim that was made."""
        if self.claim_key is None:
            raise NotFoundError("this runtime is not pooled: it takes no claim")
        scheme, _, presented = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not _same(presented.strip(), self.claim_key):
            raise Unauthorized("missing or invalid claim key")
        if self.token is not None:
            if _same(token, self.token):
                return False  # the same claim again: idempotent
            raise Conflict("this runtime is claimed already", code="already_claimed")
        self.token = token
        return True


ClaimHeader = Annotated[str | None, Header(alias="Authorization")]
