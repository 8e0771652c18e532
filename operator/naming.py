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
  (characters replaced, case folded, truncated) a 16-hex-digit (64-bit) hash of the whole
  input is appended, and inputs that already end like a hash suffix (8 or 16 hex digits)
  are hashed too. 64 bits because the slug is lossy and short (a long tenant id leaves a
  few characters of the user id): the hash alone tells ids apart, and a birthday search
  for a collision costs ~2^32 tries at 32 bits (seconds) but ~2^64 at 64.
- Names before 2026-11-28 carried an 8-hex-digit hash (``legacy=True`` computes them).
  Objects made then keep their names: readers look up the legacy name when the current
  one is absent and accept it only when its recorded owner is the caller (API backends),
  and a SandboxSession without ``ANNOTATION_NAMES`` keeps legacy names for its children
  (``legacy_children``). A current name never equals another id's legacy name: unhashed
  names never end like a hash, and hashed ones end in 16 hex digits, legacy ones in 8.
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
# another input's slug-plus-hash (of either scheme: see the contract).
_HASHED = re.compile(r"-(?:[0-9a-f]{8}|[0-9a-f]{16})$")
_LEGACY_HASHED = re.compile(r"-[0-9a-f]{8}$")
_HASH_HEX = 16  # 64 bits
_LEGACY_HASH_HEX = 8
# On a SandboxSession made with current names for its children (pod, Secret, claim);
# absent on those made before: they keep their children's legacy names.
ANNOTATION_NAMES = "sandboxworkspace.io/names"
NAMES_CURRENT = "v2"


def legacy_children(annotations: dict[str, str] | None) -> bool:
    """Whether a SandboxSession with these annotations names its children the legacy way."""
    return (annotations or {}).get(ANNOTATION_NAMES) != NAMES_CURRENT


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


def session_name(session_id: str, *, legacy: bool = False) -> str | None:
    """Name of the SandboxSession of a session id of either form, or None."""
    return dns_name(session_id, legacy=legacy) if _parse(session_id) else None


def _hash(value: str, digits: int = _HASH_HEX) -> str:
    return hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()[:digits]


def dns_name(value: str, *, max_length: int = _MAX_LABEL, legacy: bool = False) -> str:
    """A DNS-1123 label for ``value``; see the module contract. ``legacy``: the name
    before 2026-11-28 (32-bit hash), only ever to find objects made then."""
    hashed = _LEGACY_HASHED if legacy else _HASHED
    if len(value) <= max_length and _VALID.match(value) and not hashed.search(value):
        return value
    slug = _INVALID.sub("-", value.lower()).strip("-")
    slug = re.sub(r"-{2,}", "-", slug)
    suffix = _hash(value, _LEGACY_HASH_HEX if legacy else _HASH_HEX)
    keep = max_length - len(suffix) - 1
    slug = slug[:keep].rstrip("-")
    return f"{slug}-{suffix}" if slug else f"x-{suffix}"


# -- names of the objects the operator and the API create --------------------------------
# Each is a function of one session name (itself a DNS label), so they are deterministic;
# a fixed suffix keeps them distinct per kind, and dns_name keeps them valid when long.


def session_name_for(user_id: str, tenant: str = DEFAULT_TENANT) -> str:
    """Name of the user's SandboxSession resource (the DNS slug of the session id)."""
    return dns_name(session_id_for(user_id, tenant))


# ``legacy``: the session's children are named as before 2026-11-28 (``legacy_children``).


def runtime_pod_name(session_name: str, *, legacy: bool = False) -> str:
    return dns_name(session_name, legacy=legacy)


def runtime_secret_name(session_name: str, *, legacy: bool = False) -> str:
    return dns_name(f"{session_name}-token", legacy=legacy)


def workspace_claim_name(session_name: str, *, legacy: bool = False) -> str:
    return dns_name(f"{session_name}-workspace", legacy=legacy)


def workspace_name(session_name: str, conversation_id: str, *, legacy: bool = False) -> str:
    """Name of a ConversationWorkspace. The pair is joined with '/', which no Kubernetes
    name contains (so the split is unambiguous) and a slug never keeps (so the result is
    always hashed over both ids): no two pairs share a name."""
    return dns_name(f"{session_name}/{conversation_id}", legacy=legacy)


def cleanup_pod_name(claim_name: str) -> str:
    """The short-lived pod deleting directories from an orphaned claim."""
    return dns_name(f"{claim_name}-cleanup")


def cleanup_secret_name(claim_name: str) -> str:
    return dns_name(f"{claim_name}-cleanup-token")
