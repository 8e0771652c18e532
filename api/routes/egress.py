"""/api/v1/sessions/{id}/egress — read and change the caller's session's egress policy.

Contract: deny by default (``rules: null`` — no policy — means no network at all; an
empty list allows nothing either); each rule allows a host (exact, or ``*.suffix`` for
the names below it), ports and schemes (``https``: a CONNECT tunnel carrying TLS to that
name; ``http``: a plain request the proxy forwards). A change applies to the session's
next connection, on a live session too, and closes the open tunnels it no longer allows
(the backend's proxy re-checks them). Validated by the policy module's own rules (422
naming the bad rule); a backend that cannot enforce a policy answers 409
``egress_unavailable`` rather than pretend.
"""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter
from pydantic import BaseModel, Field

from sandbox_workspace.contract.errors import ApiError, NotFoundError
from sandbox_workspace.egress.policy import EgressPolicy, PolicyError, Rule

from ..backends.base import EgressUnavailable
from ..deps import CallerDep, ServicesDep
from ..names import SessionIdPath
from ..openapi import errors

router = APIRouter(prefix="/api/v1/sessions", tags=["sessions"])

MAX_RULES = 100


# A DNS name of ASCII labels, optionally ``*.``-prefixed, whose last label starts with a
# letter: no IP address in any form inet_aton takes (2130706433, 0x7f.1, 127.1) fits.
HOST_PATTERN = r"^(\*\.)?([A-Za-z0-9_-]{1,63}\.)*[A-Za-z][A-Za-z0-9_-]{0,62}\.?$"
Port = Annotated[int, Field(ge=1, le=65535)]


class EgressRule(BaseModel):
    host: str = Field(
        max_length=253,
        pattern=HOST_PATTERN,
        description="`pypi.org`, or `*.pythonhosted.org` (the names below it, not itself); "
        "never an IP address.",
    )
    ports: list[Port] = Field([443], min_length=1, max_length=32)
    schemes: list[Literal["http", "https"]] = Field(["https"], min_length=1, max_length=2)


class EgressPolicyBody(BaseModel):
    rules: list[EgressRule] | None = Field(
        None,
        max_length=MAX_RULES,
        description="What code may reach through the egress proxy; null: no network.",
    )

    @classmethod
    def of(cls, policy: EgressPolicy | None) -> EgressPolicyBody:
        if policy is None:
            return cls(rules=None)
        return cls(
            rules=[
                EgressRule(host=r.host, ports=sorted(r.ports), schemes=sorted(r.schemes))
                for r in policy.rules
            ]
        )

    def policy(self) -> EgressPolicy | None:
        if self.rules is None:
            return None
        made = []
        for i, rule in enumerate(self.rules):
            try:
                made.append(Rule.make(rule.host, ports=rule.ports, schemes=rule.schemes))
            except PolicyError as e:
                raise InvalidEgressRule(f"rules[{i}]: {e}") from None
        return EgressPolicy(tuple(made))


class InvalidEgressRule(ApiError):
    status, code = 422, "invalid_egress_rule"


async def _known(services, caller, session_id: str) -> str:
    sid = services.sessions.own_session_id(caller, session_id)
    if await services.backend.get_session(sid) is None:
        raise NotFoundError(f"session '{session_id}' not found")
    if getattr(services.backend, "set_egress_policy", None) is None:
        raise EgressUnavailable("this backend does not enforce egress policies yet")
    return sid


@router.get("/{session_id}/egress", responses=errors(404, 409))
async def get_egress(
    session_id: SessionIdPath, caller: CallerDep, services: ServicesDep
) -> EgressPolicyBody:
    """The session's egress policy (``rules: null``: no network)."""
    sid = await _known(services, caller, session_id)
    try:
        return EgressPolicyBody.of(await services.backend.egress_policy(sid))
    except KeyError:
        raise NotFoundError(f"session '{session_id}' not found") from None


@router.put("/{session_id}/egress", responses=errors(404, 409, 422))
async def put_egress(
    session_id: SessionIdPath, body: EgressPolicyBody, caller: CallerDep, services: ServicesDep
) -> EgressPolicyBody:
    """Replace the session's egress policy; its next connection is judged by it."""
    sid = await _known(services, caller, session_id)
    policy = body.policy()
    try:
        await services.backend.set_egress_policy(sid, policy)
    except KeyError:
        raise NotFoundError(f"session '{session_id}' not found") from None
    return EgressPolicyBody.of(policy)
