"""The id rules: what a file name, a conversation id and a user id may be — the one source.

Contract:
- ``check_name`` decides. It accepts a single path component (a file name or an id) or
  raises ``UnsafePath`` saying what is wrong. Refused: empty, ``.``/``..``, ``/``, ``\\``,
  NUL and other control or invisible formatting characters, names over 255 UTF-8 bytes,
  and names that some other layer could *normalise* into one of those (NFKC lookalikes
  such as ``U+2025`` "‥" or fullwidth solidus). Accepted names are returned in NFC so the
  same visible name always maps to the same file.
- A conversation id is a name that does not start with '.' (the runtime keeps its own
  state in dot-directories); a user id is a name. ``check_conversation_id`` and
  ``check_user_id`` raise ``UnsafePath``; ``conversation_id_or_400`` and
  ``file_name_or_400`` raise the error contract's ``BadRequest`` (codes
  ``invalid_conversation_id`` / ``invalid_file_name``) for the runtime's and the API's
  handlers.
- The other forms of the rule are derived from ``check_name`` and may be looser, never
  stricter: ``NAME_PATTERN`` / ``CONVERSATION_ID_PATTERN`` (the OpenAPI document, a
  portable ECMA-262 pattern) refuse exactly the Basic-Multilingual-Plane characters
  ``check_name`` refuses — the class is computed by asking ``check_name`` about each one;
  ``CRD_NAME_PATTERN`` / ``CRD_CONVERSATION_ID_PATTERN`` with the CEL rules ``CRD_NOT_DOTS``
  and ``CRD_MAX_BYTES`` are the apiserver's approximation (a pattern cannot say
  "invisible" or "NFKC lookalike"); the operator's models re-check with the real function.
  tests/unit/test_ids.py holds every form against ``check_name``.
"""

from __future__ import annotations

import functools
import unicodedata
from collections.abc import Callable

from .errors import BadRequest

MAX_NAME_BYTES = 255


class UnsafePath(ValueError):
    """A name or path that must not be used; the message says why."""


def _is_invisible_or_control(ch: str) -> bool:
    # Cc: C0/C1 controls incl. NUL, newline, DEL. Cf: bidi overrides, zero-width joiners —
    # they make two different names look identical in a file list.
    # Zs other than the plain space: no-break/ideographic spaces render like a space.
    category = unicodedata.category(ch)
    return category in ("Cc", "Cf", "Zl", "Zp") or (category == "Zs" and ch != " ")


def check_name(name: str, *, what: str = "name") -> str:
    """Validate one path component and return it in NFC, or raise ``UnsafePath``."""
    if not isinstance(name, str) or name == "":
        raise UnsafePath(f"{what} must not be empty")
    try:
        name.encode("utf-8")
    except UnicodeEncodeError as e:  # lone surrogates cannot be a file name
        raise UnsafePath(f"{what} must be valid Unicode") from e
    for ch in name:
        if ch == "\x00":
            raise UnsafePath(f"{what} must not contain NUL")
        if ch in "/\\":
            raise UnsafePath(f"{what} must be a single name without '/' or '\\'")
        if _is_invisible_or_control(ch):
            raise UnsafePath(f"{what} must not contain control or invisible characters")
    normalized = unicodedata.normalize("NFC", name)
    if normalized in (".", ".."):
        raise UnsafePath(f"{what} must not be '.' or '..'")
    # Another layer (a browser, a zip tool, a filesystem) may apply NFKC; a name must not
    # turn into a separator or a dot-dot there either.
    folded = unicodedata.normalize("NFKC", name)
    if folded in (".", "..") or "/" in folded or "\\" in folded or "\x00" in folded:
        raise UnsafePath(f"{what} contains characters that normalise to a path separator or '..'")
    if name.strip() != name:
        raise UnsafePath(f"{what} must not start or end with whitespace")
    if len(normalized.encode("utf-8")) > MAX_NAME_BYTES:
        raise UnsafePath(f"{what} is longer than {MAX_NAME_BYTES} bytes in UTF-8")
    return normalized


def split_relative(path: str, *, what: str = "path") -> list[str]:
    """Split a relative path into checked components; absolute paths are refused."""
    if not path:
        raise UnsafePath(f"{what} must not be empty")
    if path.startswith("/"):
        raise UnsafePath(f"{what} must be relative, not absolute")
    if "\\" in path:
        raise UnsafePath(f"{what} must not contain '\\'")
    return [check_name(part, what=what) for part in path.split("/")]


def check_conversation_id(value: str, *, what: str = "conversationId") -> str:
    """A conversation id in NFC: a name not starting with '.' (``UnsafePath`` otherwise)."""
    cid = check_name(value, what=what)
    if cid.startswith("."):
        raise UnsafePath(f"{what} must not start with '.'")
    return cid


def check_user_id(value: str) -> str:
    """A user id obeys the rule for a name (``UnsafePath`` otherwise)."""
    check_name(value, what="userId")
    return value


def conversation_id_or_400(value: str) -> str:
    """``check_conversation_id`` for a request: a refused id is a 400 saying why."""
    try:
        return check_conversation_id(value, what="conversation_id")
    except UnsafePath as e:
        raise BadRequest(str(e), code="invalid_conversation_id") from e


def file_name_or_400(name: str) -> str:
    """``check_name`` for a file name in a request: a refused name is a 400 saying why."""
    try:
        return check_name(name, what="file name")
    except UnsafePath as e:
        raise BadRequest(str(e), code="invalid_file_name") from e


def pydantic_rule(check: Callable[[str], str]) -> Callable[[object], object]:
    """A pydantic validator applying one of these rules to a string. The value is kept
    verbatim (not its NFC form): a custom resource holds what its writer wrote."""

    def validate(value: object) -> object:
        if not isinstance(value, str):
            return value
        try:
            check(value)
        except UnsafePath as e:
            raise ValueError(str(e)) from None
        return value

    return validate


# ---- the OpenAPI patterns, computed from check_name ----------------------------------


def _refused(ch: str) -> bool:
    """``check_name`` refuses any name holding ``ch`` (asked between two letters, so only
    the character itself decides: not emptiness, dots or surrounding space)."""
    try:
        check_name(f"a{ch}a")
    except UnsafePath:
        return True
    return False


def _ranges(codepoints: list[int]) -> str:
    out: list[str] = []
    start = prev = codepoints[0]
    for cp in [*codepoints[1:], -1]:
        if cp == prev + 1:
            prev = cp
            continue
        out.append(f"\\u{start:04x}" if start == prev else f"\\u{start:04x}-\\u{prev:04x}")
        start = prev = cp
    return "".join(out)


@functools.cache
def _refused_class() -> str:
    # Surrogates are left out of the class: in ECMA-262 without the `u` flag they are how
    # every astral character (emoji, CJK extensions) is spelled, and those names are fine.
    # Computed once, on first use (~0.1 s): the runtime and the operator never need it.
    return _ranges(
        [cp for cp in range(0x10000) if not 0xD800 <= cp <= 0xDFFF and _refused(chr(cp))]
    )


# Names that are, or NFKC-fold to, "." or "..".
_DOTS = "[.\\u2024\\ufe52\\uff0e]{1,2}$|[\\u2025\\ufe30]$"


def openapi_name_pattern() -> str:
    """A file name as a portable pattern: exactly ``check_name`` on the BMP, except the
    255-byte limit (``maxLength`` counts characters) and invisible astral characters."""
    return f"^(?!{_DOTS}){_body()}"


def openapi_conversation_id_pattern() -> str:
    """``openapi_name_pattern`` for a conversation id: no leading '.' nor a lookalike."""
    return f"^(?![.\\u2024\\u2025\\ufe30\\ufe52\\uff0e]){_body()}"


def _body() -> str:
    refused = _refused_class()
    return f"[^{refused} ]([^{refused}]*[^{refused} ])?$"


NAME_RULES = (
    f"1-{MAX_NAME_BYTES} bytes in UTF-8; no '/', '\\', control or invisible characters, no "
    "leading or trailing space, not '.' or '..' (nor characters that normalise to those)"
)

# ---- the CRDs' approximation (apiserver admission) ------------------------------------
# No '/', '\\', C0/C1 control character or surrounding whitespace; the CEL rules add "not
# '.' or '..'" and the byte limit. Looser than check_name (invisible and NFKC-lookalike
# characters pass admission), which the operator's models apply after.
_BAD = r"/\\\x00-\x1f\x7f-\x9f"
CRD_NAME_PATTERN = rf"^[^\s{_BAD}]([^{_BAD}]*[^\s{_BAD}])?$"
CRD_CONVERSATION_ID_PATTERN = rf"^[^.\s{_BAD}]([^{_BAD}]*[^\s{_BAD}])?$"
CRD_NOT_DOTS = {"rule": "self != '.' && self != '..'", "message": "must not be '.' or '..'"}
CRD_MAX_BYTES = {
    "rule": f"size(bytes(self)) <= {MAX_NAME_BYTES}",
    "message": f"must be at most {MAX_NAME_BYTES} bytes in UTF-8",
}
