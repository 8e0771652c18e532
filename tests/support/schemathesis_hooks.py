"""Schemathesis hooks of the contract test (loaded with SCHEMATHESIS_HOOKS): a format's
strategy, and a failure filter for the rules JSON Schema cannot state (below).

The API documents ids and file names with a pattern plus ``format: sandbox-name``
(``api.names``): the pattern states every rule a portable regex can, the format stands for
the whole rule — including the two a pattern cannot state (255 bytes in UTF-8, invisible
characters outside the BMP). Here the format gets its strategy: any text the server's own
``check_name`` accepts, drawn from all of Unicode, so positive cases test the real rule.
"""

from __future__ import annotations

import re

import schemathesis
from hypothesis import strategies as st
from schemathesis.core.failures import AcceptedNegativeData
from schemathesis.openapi.checks import RejectedPositiveData

from sandbox_workspace.api.chat.run_events import parse_approval_id
from sandbox_workspace.api.names import NAME_FORMAT, NAME_PATTERN
from sandbox_workspace.api.routes.ag_ui import content_text
from sandbox_workspace.api.routes.ui_chat import UiMessage, approval_answers, text_of
from sandbox_workspace.contract.errors import BadRequest
from sandbox_workspace.runtime import pathsafe
from sandbox_workspace.runtime.uploads import repeated_field_message

_PATTERN = re.compile(NAME_PATTERN)


def _accepted(name: str) -> bool:
    try:
        return pathsafe.check_name(name) == name and bool(_PATTERN.match(name))
    except pathsafe.UnsafePath:
        return False


# No surrogates: a URL or JSON text carries code points, not UTF-16 halves.
_NAMES = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=80).filter(
    _accepted
)

schemathesis.openapi.format(NAME_FORMAT, _NAMES)


# The last-message rules of /ui/chat and /ag-ui: stated in each operation's description
# and 400 (``LAST_MESSAGE_RULES`` in api/routes/ui_chat.py and ag_ui.py), not in JSON
# Schema, which has no keyword for an array's last item. A schema-valid request breaking
# them is answered that documented 400; so "schema-valid request rejected" is dropped
# for exactly those — the rule checked here with the server's own functions, as the
# name format above is — and for nothing else.
_RULE_CODES = {
    ("POST", "/api/v1/ui/chat"): {
        "invalid_messages",
        "nothing_to_continue",
        "invalid_approval",
        "invalid_approval_id",
        "mixed_runs",
    },
    ("POST", "/api/v1/ag-ui"): {"invalid_messages", "invalid_approval_id", "mixed_runs"},
}


def _one_run(ids: list[str]) -> bool:
    try:
        return len({parse_approval_id(i)[0] for i in ids}) <= 1
    except BadRequest:
        return False


def _ui_chat_breaks_rule(body: dict) -> bool:
    last = UiMessage.model_validate(body["messages"][-1])
    if last.role != "assistant":
        return not (last.role == "user" and text_of(last))
    try:
        answers = approval_answers(last)
    except BadRequest:
        return True
    return not answers or not _one_run([a.approval_id for a in answers])


def _ag_ui_breaks_rule(body: dict) -> bool:
    if body.get("resume"):
        return not _one_run([entry["interruptId"] for entry in body["resume"]])
    last = (body.get("messages") or [{}])[-1]
    return not (last.get("role") == "user" and content_text(last.get("content")))


_BREAKS_RULE = {
    ("POST", "/api/v1/ui/chat"): _ui_chat_breaks_rule,
    ("POST", "/api/v1/ag-ui"): _ag_ui_breaks_rule,
}


# A multipart form's fields are text on the wire. Schemathesis (4.32) can put a number or a
# boolean in a `type: string` form field as a "schema-violating" case, but what it sends is
# its text — the number's decimal text ("-12149"), the boolean's JSON spelling ("false"): a
# string, and a schema-valid one when it meets the field's own pattern and lengths — so the
# server rightly accepts it (seen in CI: seed 003's upload `path` "-12149", and seed
# 20261128's `path` "false", both valid file names). "Schema-violating request accepted"
# is dropped for exactly that: a type change of one form field to a number or boolean
# whose text the field's schema allows; any other violation in the case is still reported.
_FORM_TYPE_CHANGE = re.compile(
    r"Invalid component: in body - violates `type` at /properties/([^/ ]+) "
    r"\(was string, became (?:integer|number|boolean)\)$"
)


def _form_text(value) -> str | None:
    """The text Schemathesis sends for a scalar form value (None: not a scalar it sends so)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    return None


_FORM = "multipart/form-data"


def _is_form(case) -> bool:
    """The case sends a multipart form whose fields Schemathesis drew as a dict."""
    media = (case.media_type or "").split(";")[0].strip()
    return media == _FORM and isinstance(case.body, dict)


def _form_number_is_valid_text(failure, case) -> bool:
    found = _FORM_TYPE_CHANGE.search(failure.message)
    if not found or not _is_form(case):
        return False
    name = found.group(1)
    text = _form_text(case.body.get(name))
    if text is None:
        return False
    body = case.operation.definition.raw.get("requestBody", {})
    field = body.get("content", {}).get(_FORM, {}).get("schema", {}).get("properties", {})
    schema = field.get(name)
    if not isinstance(schema, dict):
        return False
    pattern = schema.get("pattern")
    return (
        schema.get("minLength", 0) <= len(text) <= schema.get("maxLength", len(text))
        and (pattern is None or re.search(pattern, text) is not None)
        and (schema.get("format") != NAME_FORMAT or _accepted(text))
    )


# The upload's `description` has no type (a form field is text whatever it looks like,
# "5" or "[]"), so an array is schema-valid for it — and Schemathesis sends an array form
# value as the field repeated, once per item (OpenAPI's form encoding). Every upload
# answers a repeated field its documented 400 (`repeated_field_message`): one description
# per file, never a silent pick of one of them. (`"not": {"type": "array"}` would state it
# in the schema, but Schemathesis 4.32's coverage phase crashes on `not` beside a binary
# field.) "Schema-valid request rejected" is dropped for exactly that: a 400 naming a field
# the case sent as two parts or more.
def _repeated_field_refused(case, response) -> bool:
    if not _is_form(case):
        return False
    try:
        message = response.json()["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return False
    return response.status_code == 400 and any(
        isinstance(value, list) and len(value) > 1 and message == repeated_field_message(name)
        for name, value in case.body.items()
    )


@schemathesis.hook
def filter_failure(context, failure, case, response) -> bool:
    """Keep every failure but a documented last-message 400 of a body that breaks it, a
    number or boolean sent as a form field's text that the field's schema allows, and the
    400 of a form field the case sent more than once."""
    if isinstance(failure, AcceptedNegativeData) and _form_number_is_valid_text(failure, case):
        return False
    if isinstance(failure, RejectedPositiveData) and _repeated_field_refused(case, response):
        return False
    key = (case.operation.method.upper(), case.operation.path)
    if not isinstance(failure, RejectedPositiveData) or key not in _RULE_CODES:
        return True
    try:
        code = response.json()["error"]["code"]
    except (ValueError, KeyError, TypeError):
        return True
    breaks = isinstance(case.body, dict) and _BREAKS_RULE[key](case.body)
    return not (response.status_code == 400 and code in _RULE_CODES[key] and breaks)
