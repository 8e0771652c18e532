"""Where a conversation's objects live in the store (seed 003's key layout, scoped).

    {prefix}{scope}/{conversation_id}/{file_path}          a file's bytes
    {prefix}{scope}/{conversation_id}/.sbw/files.json      the conversation's metadata head
    {prefix}{scope}/{conversation_id}/.sbw/shards/…        its immutable shards (``manifest``)

- ``prefix`` is ``SANDBOX_WORKSPACE_S3__PREFIX`` (default ``workspaces/``).
- ``scope`` keeps two users' conversations of the same id apart: ``{tenant}/{session_id}``
  — the session's tenant and id, each percent-encoded (``scope_segment``) so that no id
  can add a ``/`` or equal another id's encoding. A session is one per (tenant, user)
  (``sb-session-{user_id}`` in the default tenant, ``sb-tenant-…`` in another:
  operator/naming.py), so the tenant is the session's own. Seed 003 has no scope because
  its conversation ids are global; ours are chosen by callers, so two users may pick the
  same.
- ``conversation_id`` is as the API checks it (no ``/``, ``\\``, control characters, no
  leading ``.``), and ``file_path`` is the file's path relative to the conversation's
  directory — the path agent code opens, e.g. ``uploads/temparea/report.pdf``.
- ``.sbw/`` at the top of a conversation is reserved for metadata: no file path may begin
  with it (``check_file_path``), so no file can overwrite it.
- Deleting a conversation deletes the prefix ``{prefix}{scope}/{conversation_id}/``;
  deleting a session, ``{prefix}{tenant}/{session_id}/`` for every tenant it was used under.
"""

from __future__ import annotations

from dataclasses import dataclass

from .base import check_key, scope_segment

DEFAULT_TENANT = "default"
RESERVED = ".sbw"
MANIFEST = f"{RESERVED}/files.json"


def check_file_path(file_path: str) -> str:
    check_key(file_path)
    if file_path.split("/", 1)[0] == RESERVED:
        raise ValueError(f"file paths under {RESERVED}/ are reserved for metadata")
    return file_path


@dataclass(frozen=True)
class Scope:
    """Whose conversations: a tenant and a session."""

    tenant: str
    session_id: str

    @property
    def key(self) -> str:
        return f"{scope_segment(self.tenant or DEFAULT_TENANT)}/{scope_segment(self.session_id)}"


@dataclass(frozen=True)
class Layout:
    prefix: str = "workspaces/"

    def conversation(self, scope: Scope, conversation_id: str) -> str:
        """The prefix of every object of a conversation (ends with ``/``)."""
        return check_key(f"{self.prefix}{scope.key}/{conversation_id}") + "/"

    def file(self, scope: Scope, conversation_id: str, file_path: str) -> str:
        return self.conversation(scope, conversation_id) + check_file_path(file_path)

    def manifest(self, scope: Scope, conversation_id: str) -> str:
        return self.conversation(scope, conversation_id) + MANIFEST

    def metadata(self, scope: Scope, conversation_id: str, relative: str) -> str:
        """An object of the conversation's metadata, ``relative`` to its ``.sbw/``."""
        return check_key(self.conversation(scope, conversation_id) + f"{RESERVED}/{relative}")

    def session(self, tenant: str, session_id: str) -> str:
        return f"{self.prefix}{Scope(tenant, session_id).key}/"
