"""JSON pointers into a table's data (RFC 6901), as seed 002's access points use them.

Contract (pure functions, no I/O):
- ``parse(path)`` → the reference tokens. ``""`` and ``"/"`` both name the root (the
  seed's rule; RFC 6901 would read ``"/"`` as the key ``""``, which a table's access point
  never means). Otherwise the path starts with ``/``; ``~1`` is ``/`` and ``~0`` is ``~``
  in a token; any other ``~`` is refused (``PointerError``).
- ``resolve(doc, tokens)`` → the node, or ``MISSING`` when there is none: a key absent,
  an array index out of range or not canonical (``01``, ``+1``, ``-1``), ``-`` (the
  element after the last, which never exists), a step into a scalar.
- ``merge(doc, tokens, value)`` → a new document with ``value`` at the pointer (the
  node replaced, not deep-merged: what the agent left is the node's new value — seed
  002's ``mergeDataByPath``); ``doc`` is not modified. The parent must exist; on an
  array the index must exist or be ``-`` (appends). The root pointer returns ``value``.
- ``overlaps(a, b)``: one pointer is the other or lies beneath it.
"""

from __future__ import annotations

import copy
import re
from typing import Any


class PointerError(ValueError):
    """A malformed pointer, or one ``merge`` cannot place."""


class _Missing:
    def __repr__(self) -> str:
        return "MISSING"


MISSING: Any = _Missing()
_INDEX = re.compile(r"0|[1-9][0-9]*")


def parse(path: str) -> tuple[str, ...]:
    if path in ("", "/"):
        return ()
    if not path.startswith("/"):
        raise PointerError(f"a JSON pointer starts with '/' (or is empty for the root): {path!r}")
    tokens = []
    for raw in path[1:].split("/"):
        if re.search(r"~(?![01])", raw):
            raise PointerError(f"'~' must be followed by 0 or 1 in a JSON pointer: {path!r}")
        tokens.append(raw.replace("~1", "/").replace("~0", "~"))
    return tuple(tokens)


def format_pointer(tokens: tuple[str, ...]) -> str:
    return "".join("/" + t.replace("~", "~0").replace("/", "~1") for t in tokens) or "/"


def _index(node: list, token: str) -> int | None:
    if not _INDEX.fullmatch(token):
        return None
    i = int(token)
    return i if i < len(node) else None


def resolve(doc: Any, tokens: tuple[str, ...]) -> Any:
    node = doc
    for token in tokens:
        if isinstance(node, dict):
            if token not in node:
                return MISSING
            node = node[token]
        elif isinstance(node, list):
            i = _index(node, token)
            if i is None:
                return MISSING
            node = node[i]
        else:
            return MISSING
    return node


def merge(doc: Any, tokens: tuple[str, ...], value: Any) -> Any:
    if not tokens:
        return copy.deepcopy(value)
    out = copy.deepcopy(doc)
    parent = resolve(out, tokens[:-1])
    last = tokens[-1]
    where = format_pointer(tokens)
    if isinstance(parent, dict):
        parent[last] = copy.deepcopy(value)
    elif isinstance(parent, list):
        if last == "-":
            parent.append(copy.deepcopy(value))
        else:
            i = _index(parent, last)
            if i is None:
                raise PointerError(f"no array element {last!r} to replace at {where}")
            parent[i] = copy.deepcopy(value)
    else:
        raise PointerError(f"the parent of {where} is not an object or array in the table")
    return out


def overlaps(a: tuple[str, ...], b: tuple[str, ...]) -> bool:
    shorter = min(len(a), len(b))
    return a[:shorter] == b[:shorter]
