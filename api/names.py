"""The rules for ids and names, as OpenAPI patterns a client can check before sending.

Contract: ``NAME_PATTERN`` (file names) and ``CONVERSATION_ID_PATTERN`` describe exactly the
characters ``runtime.pathsafe.check_name`` (and ``Workspace.check_conversation_id``)
accept, so a name that fails the pattern is always refused by the server. Two limits a
portable (ECMA-262, no ``u`` flag) pattern cannot state remain, and the server answers
400 for them: more than 255 bytes in UTF-8 (``maxLength`` counts characters; 85 always
fit), and the few invisible formatting characters outside the Basic Multilingual Plane
(e.g. U+E0001). The patterns are built from ``unicodedata`` at import, so they follow the
interpreter's Unicode version exactly as ``check_name`` does.

The patterns document; enforcement stays with ``check_name``, whose messages say what to
change (a failed regex could only say "does not match").
"""

from __future__ import annotations

import unicodedata
from typing import Annotated

from fastapi import Path

from sandbox_workspace.runtime.pathsafe import MAX_NAME_BYTES

NAME_FORMAT = "sandbox-name"


def _refused(ch: str) -> bool:
    category = unicodedata.category(ch)
    folded = unicodedata.normalize("NFKC", ch)
    return (
        ch in "/\\"
        or category in ("Cc", "Cf", "Zl", "Zp", "Cs")
        or (category == "Zs" and ch != " ")
        or "/" in folded
        or "\\" in folded
        or "\x00" in folded
    )


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


# Surrogates are left out of the class: in ECMA-262 without the `u` flag they are how
# every astral character (emoji, CJK extensions) is spelled, and those names are fine.
_REFUSED = _ranges(
    [cp for cp in range(0x10000) if not 0xD800 <= cp <= 0xDFFF and _refused(chr(cp))]
)
# Names that are, or NFKC-fold to, "." or "..".
_DOTS = "[.\\u2024\\ufe52\\uff0e]{1,2}$|[\\u2025\\ufe30]$"
_BODY = f"[^{_REFUSED} ]([^{_REFUSED}]*[^{_REFUSED} ])?$"

NAME_PATTERN = f"^(?!{_DOTS}){_BODY}"
CONVERSATION_ID_PATTERN = f"^(?![.\\u2024\\u2025\\ufe30\\ufe52\\uff0e]){_BODY}"

NAME_RULES = (
    f"1-{MAX_NAME_BYTES} bytes in UTF-8; no '/', '\\', control or invisible characters, no "
    "leading or trailing space, not '.' or '..' (nor characters that normalise to those)"
)


def name_schema(what: str) -> dict:
    """JSON-schema keywords of one path component (a file name)."""
    return {
        "type": "string",
        "pattern": NAME_PATTERN,
        "minLength": 1,
        "maxLength": MAX_NAME_BYTES,
        "format": NAME_FORMAT,
        "description": f"{what}: {NAME_RULES}.",
    }


def conversation_id_schema() -> dict:
    return {
        "type": "string",
        "pattern": CONVERSATION_ID_PATTERN,
        "minLength": 1,
        "maxLength": MAX_NAME_BYTES,
        "format": NAME_FORMAT,
        "description": f"Conversation id: {NAME_RULES}; must not start with '.'.",
    }


def _without_description(schema: dict) -> dict:
    return {k: v for k, v in schema.items() if k != "description"}


SessionIdPath = Annotated[str, Path(description="`sb-session-{user_id}` of the caller.")]
ConversationIdPath = Annotated[
    str,
    Path(
        description=conversation_id_schema()["description"],
        json_schema_extra=_without_description(conversation_id_schema()),
    ),
]
