"""The contract test's failure filter (tests/support/schemathesis_hooks.py) drops exactly
the documented answers it names and keeps every other failure: each allowance is checked
here both ways, on the case shapes Schemathesis 4.32 produced in CI."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from schemathesis.core.failures import AcceptedNegativeData
from schemathesis.openapi.checks import RejectedPositiveData

from sandbox_workspace.api.names import name_schema
from sandbox_workspace.runtime.uploads import repeated_field_message
from tests.support import schemathesis_hooks as hooks

UPLOAD = "/api/v1/sessions/{session_id}/workspace/{conversation_id}/files"
FORM = "multipart/form-data"


def _case(body: dict, path: str = UPLOAD):
    schema = {"properties": {"path": name_schema("File name"), "description": {"maxLength": 9}}}
    raw = {"requestBody": {"content": {FORM: {"schema": schema}}}}
    operation = SimpleNamespace(method="post", path=path, definition=SimpleNamespace(raw=raw))
    return SimpleNamespace(operation=operation, body=body, media_type=f"{FORM}; boundary=x")


def _answer(status: int, message: str):
    payload = {"error": {"code": "bad_request", "message": message}}
    return SimpleNamespace(status_code=status, json=lambda: payload)


def _rejected() -> RejectedPositiveData:
    return RejectedPositiveData(
        operation=UPLOAD,
        message="Valid data should have been accepted",
        status_code=400,
        allowed_statuses=["2xx"],
    )


def _accepted(field: str, became: str) -> AcceptedNegativeData:
    return AcceptedNegativeData(
        operation=UPLOAD,
        message="Invalid data should have been rejected\nExpected: 400\n"
        f"Invalid component: in body - violates `type` at /properties/{field} "
        f"(was string, became {became})",
        status_code=201,
        expected_statuses=["400"],
    )


def _kept(failure, case, response) -> bool:
    return hooks.filter_failure(None, failure, case, response)


def test_a_field_sent_as_two_parts_may_be_refused():
    case = _case({"file": b"x", "description": [[], {}]})
    refused = _answer(400, repeated_field_message("description"))
    assert not _kept(_rejected(), case, refused)


@pytest.mark.parametrize(
    ("body", "response"),
    [
        # Sent once (a one-item array is one part): the refusal is a real failure.
        (
            {"file": b"x", "description": ["once"]},
            _answer(400, repeated_field_message("description")),
        ),
        (
            {"file": b"x", "description": "once"},
            _answer(400, repeated_field_message("description")),
        ),
        # Sent twice, but the 400 names another field, or says something else.
        ({"file": b"x", "description": ["a", "b"]}, _answer(400, repeated_field_message("path"))),
        ({"file": b"x", "description": ["a", "b"]}, _answer(400, "something else broke")),
        # Not a 400.
        (
            {"file": b"x", "description": ["a", "b"]},
            _answer(409, repeated_field_message("description")),
        ),
    ],
)
def test_any_other_refusal_is_kept(body, response):
    assert _kept(_rejected(), _case(body), response)


@pytest.mark.parametrize(
    ("value", "became"), [(False, "boolean"), (True, "boolean"), (-12149, "integer")]
)
def test_a_scalar_whose_text_is_a_valid_name_may_be_accepted(value, became):
    assert not _kept(_accepted("path", became), _case({"file": b"x", "path": value}), None)


@pytest.mark.parametrize(
    ("field", "value", "became"),
    [
        ("path", [1, 2], "array"),  # not a scalar sent as text
        ("description", 1234567890123, "integer"),  # its text breaks maxLength 9
        ("path", {"a": 1}, "object"),
    ],
)
def test_any_other_accepted_violation_is_kept(field, value, became):
    assert _kept(_accepted(field, became), _case({"file": b"x", field: value}), None)
