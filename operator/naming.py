"""Names: session ids from user ids, and DNS-safe Kubernetes names from any id.

Contract:
- ``session_id_for(user_id)`` is ``sb-session-{user_id}`` (seed 000 §2.1), the id clients
  see; it is fixed per user, so nothing has to be stored to find a user's session.
- A caller of another tenant than ``default`` has a session of its own per (tenant, user):
  ``session_id_for(user_id, tenant)`` is ``sb-tenant-{len(tenant)}-{tenant}-{user_id}``.
  The length makes the pair readable back (``tenant_of``) and the map injective; the
  prefix differs from ``sb-session-``, so no default-tenant id equals one. Resource
  names are ``dns_name`` of the id (a DNS label, at most 63 characters, injective).
- ``dns_name(value)`` is valid as an RFC 1123 label (or subdomain part) for *any* string,
  and no two different inputs share a result: whenever the slug differs from the input
  (characters replaced, case folded, truncated) an 8-hex-digit hash of the input is
  appended, and inputs that already end like a hash suffix are hashed too.
"""

from __future__ import annotations

import hashlib
import re

SESSION_PREFIX = "sb-session-"
TENANT_SESSION_PREFIX = "sb-tenant-"
DEFAULT_TENANT = "default"
_MAX_LABEL = 63
_INVALID = re.compile(r"[^a-z0-9-]+")
_VALID = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
# A valid input that already looks hashed is hashed again, so an input can never equal
# another input's slug-plus-hash.
_HASHED = re.compile(r"-[0-9a-f]{8}$")


def session_id_for(user_id: str, tenant: str = DEFAULT_TENANT) -> str:
    if tenant == DEFAULT_TENANT:
        return f"{SESSION_PREFIX}{user_id}"
    return f"{TENANT_SESSION_PREFIX}{len(tenant)}-{tenant}-{user_id}"


def _parse(session_id: str) -> tuple[str, str] | None:
    """(tenant, user id) of a session id of either form, or None for anything else."""
    if session_id.startswith(SESSION_PREFIX) and len(session_id) > len(SESSION_PREFIX):
        return DEFAULT_TENANT, session_id[len(SESSION_PREFIX) :]
    rest = session_id.removeprefix(TENANT_SESSION_PREFIX)
    length, _, rest = rest.partition("-") if rest != session_id else ("", "", "")
    if not length.isdigit() or length != str(int(length)):
        return None
    tenant, user = rest[: int(length)], rest[int(length) + 1 :]
    if rest[int(length) : int(length) + 1] != "-" or not tenant or not user:
        return None
    if tenant == DEFAULT_TENANT:
        return None  # the default tenant's sessions have the other form only
    return tenant, user


def user_id_from_session_id(session_id: str) -> str | None:
    parsed = _parse(session_id)
    return parsed[1] if parsed else None


def tenant_of(session_id: str) -> str | None:
    """The tenant of a session id (``default`` for ``sb-session-…``), or None."""
    parsed = _parse(session_id)
    return parsed[0] if parsed else None


def session_name(session_id: str) -> str | None:
    """Name of the SandboxSession of a session id of either form, or None."""
    return dns_name(session_id) if _parse(session_id) else None


def _hash(value: str) -> str:
    return hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()[:8]


def dns_name(value: str, *, max_length: int = _MAX_LABEL) -> str:
    """A DNS-1123 label for ``value``; see the module contract."""
    if len(value) <= max_length and _VALID.match(value) and not _HASHED.search(value):
        return value
    slug = _INVALID.sub("-", value.lower()).strip("-")
    slug = re.sub(r"-{2,}", "-", slug)
    suffix = _hash(value)
    keep = max_length - len(suffix) - 1
    slug = slug[:keep].rstrip("-")
    return f"{slug}-{suffix}" if slug else f"x-{suffix}"


# -- names of the objects the operator and the API create --------------------------------
# Each is a function of one session name (itself a DNS label), so they are deterministic;
# a fixed suffix keeps them distinct per kind, and dns_name keeps them valid when long.


def session_name_for(user_id: str, tenant: str = DEFAULT_TENANT) -> str:
    """Name of the user's SandboxSession resource (the DNS slug of the session id)."""
    return dns_name(session_id_for(user_id, tenant))


def runtime_pod_name(session_name: str) -> str:
    return dns_name(session_name)


def runtime_secret_name(session_name: str) -> str:
    return dns_name(f"{session_name}-token")


def workspace_claim_name(session_name: str) -> str:
    return dns_name(f"{session_name}-workspace")


def workspace_name(session_name: str, conversation_id: str) -> str:
    """Name of a ConversationWorkspace. The pair is joined with '/', which no Kubernetes
    name contains (so the split is unambiguous) and a slug never keeps (so the result is
    always hashed over both ids): no two pairs share a name."""
    return dns_name(f"{session_name}/{conversation_id}")


def cleanup_pod_name(claim_name: str) -> str:
    """The short-lived pod deleting directories from an orphaned claim."""
    return dns_name(f"{claim_name}-cleanup")


def cleanup_secret_name(claim_name: str) -> str:
    return dns_name(f"{claim_name}-cleanup-token")
