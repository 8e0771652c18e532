"""A pooled runtime's one claim: how a ready sandbox pod learns whose it is.

Contract: a runtime started with a claim key and no token (``RuntimeSettings.pooled``,
the operator's warm pool) answers ``/healthz`` and nothing else until it is claimed:
every other route is 401. ``POST /v1/claim`` with ``Authorization: Bearer <claim key>``
and ``{"token": ...}`` sets the bearer token, once: from then on only that token works.
Repeating the same claim answers 200 again (the operator may not know whether its first
attempt arrived); a claim with any other token is 409 — a pod serves one session in its
whole life. A wrong or missing claim key is 401; a runtime that is not pooled answers 404.

Who may claim: whoever holds the claim key — the operator, which keeps it in a Secret of
the namespace (``operator/pool``). The key reaches the runtime through its environment,
which the CLI scrubs before serving and executed code never inherits, exactly like the
token of a cold pod.
"""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import Header
from pydantic import BaseModel, Field

from sandbox_workspace.contract.errors import Conflict, NotFoundError, Unauthorized


class ClaimRequest(BaseModel):
    token: str = Field(
        min_length=16, max_length=512, description="The session's bearer token from now on."
    )


class Claimed(BaseModel):
    claimed: bool = True


def _same(a: str, b: str) -> bool:
    return hmac.compare_digest(a.encode(), b.encode())


class ClaimState:
    """The token of a runtime, and for a pooled one, the key that may set it once."""

    def __init__(self, token: str | None, claim_key: str | None) -> None:
        self.token = token
        self.claim_key = claim_key if token is None else None

    def claim(self, authorization: str | None, token: str) -> Claimed:
        if self.claim_key is None:
            raise NotFoundError("this runtime is not pooled: it takes no claim")
        scheme, _, presented = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not _same(presented.strip(), self.claim_key):
            raise Unauthorized("missing or invalid claim key")
        if self.token is not None:
            if _same(token, self.token):
                return Claimed()  # the same claim again: idempotent
            raise Conflict("this runtime is claimed already", code="already_claimed")
        self.token = token
        return Claimed()


ClaimHeader = Annotated[str | None, Header(alias="Authorization")]
