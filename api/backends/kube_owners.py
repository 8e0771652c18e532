"""Whose object is it: the owner a SandboxSession or ConversationWorkspace records,
compared with the caller's before anything is read from it, adopted or deleted.

Contract:
- A name is a hash of the ids (operator/naming.py), so a name alone never proves whose
  object answers: an object made under an older, shorter hash (``legacy`` names), one
  planted by hand, or a collision would be someone else's. Every read therefore compares
  the owner the object records with the ids the name was computed from:
  - a SandboxSession: ``spec.userId`` and the tenant annotation (absent: the default
    tenant) against the session id's user and tenant (``session_owned``);
  - a ConversationWorkspace: ``spec.sessionRef`` and ``spec.conversationId`` against the
    session's resource name and the conversation id (``workspace_owner``).
- A mismatch is never shared: a session read answers "absent" (404), a conversation
  write "taken" (409 ``NameTaken``), a deletion deletes nothing.
- ``candidates`` are the names to look under, current first: an object made before
  2026-11-28 keeps its legacy name, found only when no object has the current one.
"""

from __future__ import annotations

from typing import Any

from sandbox_workspace.contract import crd
from sandbox_workspace.operator import naming


def session_candidates(session_id: str) -> list[str]:
    """The SandboxSession names of ``session_id``, current first (one when equal)."""
    names = [naming.session_name(session_id), naming.session_name(session_id, legacy=True)]
    return [n for i, n in enumerate(names) if n is not None and n not in names[:i]]


def workspace_candidates(session_ref: str, conversation_id: str) -> list[str]:
    names = [
        naming.workspace_name(session_ref, conversation_id),
        naming.workspace_name(session_ref, conversation_id, legacy=True),
    ]
    return names[:1] if names[0] == names[1] else names


def session_owned(obj: dict[str, Any], session_id: str) -> bool:
    """Whether the SandboxSession ``obj`` is the one of ``session_id``."""
    meta = obj.get("metadata") or {}
    user = (obj.get("spec") or {}).get("userId")
    tenant = (meta.get("annotations") or {}).get(crd.ANNOTATION_TENANT_ID, naming.DEFAULT_TENANT)
    return (
        user is not None
        and user == naming.user_id_from_session_id(session_id)
        and tenant == naming.tenant_of(session_id)
    )


def workspace_owner(obj: dict[str, Any]) -> tuple[str, str]:
    """(sessionRef, conversationId) a ConversationWorkspace records."""
    spec = obj.get("spec") or {}
    return str(spec.get("sessionRef") or ""), str(spec.get("conversationId") or "")
