"""E2B paths onto the sandbox's home in its conversation.

E2B code habitually works in ``/home/user`` (the default user's home) and with relative
paths. Both name the sandbox's home, where its file calls and code start
(``conversation.Sandbox``: ``outputs/`` of a fresh sandbox, the directory of an attached
conversation): ``/home/user/a.txt`` and ``a.txt`` are ``{home}/a.txt``; ``/home/user``
and ``""`` are home itself. Any other
absolute path, and any path climbing out with ``..``, is a clear 400 — code runs
confined to the conversation, so there is nothing else to reach. So is a path that is
not a string, holds NUL or a lone surrogate (no file name can), or is longer than
``MAX_PATH_BYTES`` (the kernel's PATH_MAX: no file call could reach it).
"""

from __future__ import annotations

import posixpath

from sandbox_workspace.contract.errors import BadRequest

HOME = "/home/user"
MAX_PATH_BYTES = 4096


def to_relative(path: object) -> str:
    """The path below the conversation's directory, '/'-separated ('' for the directory)."""
    if path is not None and not isinstance(path, str):
        raise BadRequest("a path must be a string", code="invalid_path")
    try:
        size = len((path or "").encode())
    except UnicodeEncodeError:
        raise BadRequest("a path must be valid Unicode", code="invalid_path") from None
    if size > MAX_PATH_BYTES:
        raise BadRequest(
            f"path of {size} bytes: File name too long (at most {MAX_PATH_BYTES} bytes)",
            code="invalid_path",
        )
    path = (path or "").strip()
    if path in ("", "~", HOME, HOME + "/"):
        return ""
    if path.startswith("~/"):
        path = path[2:]
    elif path.startswith(HOME + "/"):
        path = path[len(HOME) + 1 :]
    elif path.startswith("/"):
        raise BadRequest(
            f"path '{path}' is outside the sandbox's files: use {HOME}/… or a relative path",
            code="path_not_supported",
        )
    if "\x00" in path:
        raise BadRequest("path must not contain NUL", code="invalid_path")
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise BadRequest(f"path '{path}' must not contain '..'", code="invalid_path")
    return "/".join(parts)


def to_e2b(relative: str) -> str:
    return posixpath.join(HOME, relative) if relative else HOME
