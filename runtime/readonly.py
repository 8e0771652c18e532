"""Read-only entries of a conversation, for one execution (seed 002's ``readonly`` nodes).

Landlock rules are allow-lists on hierarchies: a right granted on a directory holds for
everything beneath it, and nothing beneath can take it back. So a file cannot be made
read-only inside a directory granted read-write — renaming over it or unlinking it needs
only rights on the directory. An execution that must leave top-level entries of its
conversation (``data.json``) unchanged therefore gets other rules than the usual
"the conversation directory read-write":
- the conversation directory itself: read only (list, read, execute) — so nothing at its
  top level can be created, removed, renamed over or linked;
- every other entry of its top level, as it is when the call starts: read-write (its
  directories with every right, its regular files with the file rights). A symlink or
  special file there gets no rule (the spawner opens these with ``O_NOFOLLOW``: a link
  made by code never grants its target);
- the private scratch directory: read-write, as always.
The read-only entries get no rule of their own: the directory's read rights are all they
have — no write, no truncate, through any path, in any child process. Linking one into a
writable directory is refused too (Landlock's ``refer``: the link would gain rights).

Contract: ``check(request, confinement)`` → the names, having refused (400) anything but
plain top-level names or a ``python`` call (the persistent interpreter was confined when it
started), and (503) a runtime without Landlock — read-only is enforced or refused, never
pretended; ``rules(cwd, scratch, names)`` → ``(read_write, read_only)`` for the spawner.
"""

from __future__ import annotations

import os

from sandbox_workspace.contract.errors import BadRequest

from . import pathsafe
from .confinement import Confinement, ConfinementUnavailable
from .schemas import ExecuteRequest


def check(request: ExecuteRequest, confinement: Confinement) -> list[str]:
    if not request.read_only:
        return []
    if request.language != "bash":
        raise BadRequest(
            "read_only applies to bash calls (the python interpreter is persistent)",
            code="invalid_read_only",
        )
    if not confinement.confined:
        raise ConfinementUnavailable(
            "read_only needs Landlock, which is unavailable here: "
            + (confinement.report().reason or "confinement is off")
        )
    try:
        return [pathsafe.check_name(n, what="read_only entry") for n in request.read_only]
    except pathsafe.UnsafePath as e:
        raise BadRequest(
            f"read_only takes names of the conversation directory's top level: {e}",
            code="invalid_read_only",
        ) from e


def rules(cwd: str, scratch: str, names: list[str]) -> tuple[list[str], list[str]]:
    keep = set(names)
    with os.scandir(cwd) as entries:
        writable = sorted(e.path for e in entries if e.name not in keep)
    return [*writable, scratch], [cwd]
