"""The rules for ids and names, as OpenAPI schemas a client can check before sending.

Contract: the patterns are the contract's (``sandbox_workspace/contract/ids.py``), computed
from ``check_name`` itself, so a name that fails the pattern is always refused by the
server. Two limits a portable (ECMA-262, no ``u`` flag) pattern cannot state remain, and
the server answers 400 for them: more than 255 bytes in UTF-8 (``maxLength`` counts
characters; 85 always fit), and the few invisible formatting characters outside the Basic
Multilingual Plane (e.g. U+E0001).

The patterns document; enforcement stays with ``check_name``, whose messages say what to
change (a failed regex could only say "does not match").
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Path

from sandbox_workspace.contract.ids import (
    MAX_NAME_BYTES,
    NAME_RULES,
    openapi_conversation_id_pattern,
    openapi_name_pattern,
)

NAME_FORMAT = "sandbox-name"
NAME_PATTERN = openapi_name_pattern()
CONVERSATION_ID_PATTERN = openapi_conversation_id_pattern()


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
