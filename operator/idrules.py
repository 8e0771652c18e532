"""The runtime's rules for conversation and user ids, as the CRDs and models apply them.

Contract: ``check_conversation_id`` / ``check_user_id`` are the runtime's own rules
(``runtime/pathsafe.check_name``; a conversation id also must not start with '.'), raising
``UnsafePath`` with what is wrong. ``NAME_PATTERN`` / ``CONVERSATION_ID_PATTERN`` and the
CEL rules approximate them for the apiserver's admission (a pattern cannot say
"invisible" or "NFKC lookalike"); the models re-check with the real functions.
"""

from __future__ import annotations

from collections.abc import Callable

from sandbox_workspace.runtime.pathsafe import MAX_NAME_BYTES, UnsafePath, check_name

# The runtime's rules for a name (runtime/pathsafe.check_name), as far as a pattern can
# say them: no '/', '\\', C0/C1 control character or surrounding whitespace. The CEL
# rules NOT_DOTS and MAX_BYTES add "not '.' or '..'" and the 255-byte limit; the models
# re-check with the runtime's own function, which also refuses invisible and
# NFKC-lookalike characters.
_BAD = r"/\\\x00-\x1f\x7f-\x9f"
NAME_PATTERN = rf"^[^\s{_BAD}]([^{_BAD}]*[^\s{_BAD}])?$"
# A conversation id is a name that does not start with '.' (the runtime keeps its own
# state in dot-directories), which also rules out '.' and '..'.
CONVERSATION_ID_PATTERN = rf"^[^.\s{_BAD}]([^{_BAD}]*[^\s{_BAD}])?$"
NOT_DOTS = {"rule": "self != '.' && self != '..'", "message": "must not be '.' or '..'"}
MAX_BYTES = {
    "rule": f"size(bytes(self)) <= {MAX_NAME_BYTES}",
    "message": f"must be at most {MAX_NAME_BYTES} bytes in UTF-8",
}


def check_conversation_id(value: str) -> str:
    """The runtime's rule for a conversation id (``UnsafePath`` says what is wrong)."""
    check_name(value, what="conversationId")
    if value.startswith("."):
        raise UnsafePath("conversationId must not start with '.'")
    return value


def check_user_id(value: str) -> str:
    """A user id obeys the runtime's rule for a name (``UnsafePath`` otherwise)."""
    check_name(value, what="userId")
    return value


def runtime_rule(check: Callable[[str], str]) -> Callable[[object], object]:
    """A pydantic validator applying one of the runtime's naming rules to a string."""

    def validate(value: object) -> object:
        if not isinstance(value, str):
            return value
        try:
            return check(value)
        except UnsafePath as e:
            raise ValueError(str(e)) from None

    return validate
