"""contract/ids.py: check_name decides; every other form of the id rule follows from it.

The OpenAPI patterns accept exactly what check_name accepts on the Basic Multilingual
Plane (they are computed from it); the CRD patterns and CEL rules may be looser, never
stricter — a name the runtime accepts is never refused at admission. The accept/refuse
table of check_name itself is tests/unit/test_pathsafe.py.
"""

from __future__ import annotations

import re

import pytest

from sandbox_workspace.contract import ids
from sandbox_workspace.contract.errors import BadRequest

BMP = [chr(cp) for cp in range(0x10000) if not 0xD800 <= cp <= 0xDFFF]

# Edge cases of length, dots and astral characters; every BMP character is tried below
# (tests/api/test_openapi.py keeps its table of the served document's patterns).
SAMPLES = [
    "📊.csv",
    "...",
    "a..b",
    ".hidden",
    "..",
    "é" * 127,
    "é" * 128,
    "x" * 255,
    "x" * 256,
    " lead",
    "tag\U000e0001",
]


def accepted(name: str) -> bool:
    try:
        ids.check_name(name)
    except ids.UnsafePath:
        return False
    return True


def cid_accepted(name: str) -> bool:
    try:
        ids.check_conversation_id(name)
    except ids.UnsafePath:
        return False
    return True


def every_character_between_letters() -> list[str]:
    return [f"a{ch}a" for ch in BMP]


def test_openapi_patterns_refuse_exactly_the_characters_check_name_refuses():
    name, cid = (
        re.compile(ids.openapi_name_pattern()),
        re.compile(ids.openapi_conversation_id_pattern()),
    )
    for text in every_character_between_letters():
        assert bool(name.match(text)) == accepted(text), repr(text)
        assert bool(cid.match(text)) == cid_accepted(text), repr(text)


@pytest.mark.parametrize("text", SAMPLES, ids=range(len(SAMPLES)))
def test_openapi_patterns_never_stricter_than_check_name(text):
    """Looser only where a portable pattern cannot say the rule: bytes over 255 (a length
    in characters) and invisible characters outside the BMP."""
    if accepted(text):
        assert re.match(ids.openapi_name_pattern(), text)
    if cid_accepted(text):
        assert re.match(ids.openapi_conversation_id_pattern(), text)


def crd_admits(text: str, pattern: str, *cel: dict) -> bool:
    """What the apiserver admits: the pattern, the CEL rules (evaluated here by hand for
    the two the contract defines) and the byte limit."""
    rules = {
        ids.CRD_NOT_DOTS["rule"]: text not in (".", ".."),
        ids.CRD_MAX_BYTES["rule"]: len(text.encode()) <= ids.MAX_NAME_BYTES,
    }
    return bool(re.match(pattern, text)) and all(rules[c["rule"]] for c in cel)


def test_crd_rules_never_stricter_than_check_name():
    name_rules = (ids.CRD_NOT_DOTS, ids.CRD_MAX_BYTES)
    for text in [*SAMPLES, *every_character_between_letters()]:
        if accepted(text):
            assert crd_admits(text, ids.CRD_NAME_PATTERN, *name_rules), repr(text)
        if cid_accepted(text):
            assert crd_admits(text, ids.CRD_CONVERSATION_ID_PATTERN, ids.CRD_MAX_BYTES), repr(text)


def test_crd_rules_refuse_what_they_can_say():
    for text in (".", "..", "a/b", "a\\b", " lead", "nul\x00", "x" * 256):
        assert not crd_admits(text, ids.CRD_NAME_PATTERN, ids.CRD_NOT_DOTS, ids.CRD_MAX_BYTES)
    assert not re.match(ids.CRD_CONVERSATION_ID_PATTERN, ".hidden")


def test_a_conversation_id_is_a_name_not_starting_with_a_dot():
    assert ids.check_conversation_id("c1") == "c1"
    with pytest.raises(ids.UnsafePath, match=r"must not start with '\.'"):
        ids.check_conversation_id(".runtime")
    with pytest.raises(ids.UnsafePath, match="conversationId must not be empty"):
        ids.check_conversation_id("")


@pytest.mark.parametrize(
    ("check", "value", "code"),
    [
        pytest.param(ids.conversation_id_or_400, ".x", "invalid_conversation_id", id="dot-cid"),
        pytest.param(ids.conversation_id_or_400, "a/b", "invalid_conversation_id", id="slash"),
        pytest.param(ids.file_name_or_400, "..", "invalid_file_name", id="dotdot-file"),
    ],
)
def test_request_checks_are_400s_naming_the_field(check, value, code):
    with pytest.raises(BadRequest) as caught:
        check(value)
    assert caught.value.code == code
    assert caught.value.message.split()[0] in ("conversation_id", "file")


def test_request_checks_return_nfc():
    assert ids.conversation_id_or_400("cafe\u0301") == "caf\u00e9"
    assert ids.file_name_or_400("cafe\u0301.csv") == "caf\u00e9.csv"


def test_pydantic_rule_keeps_the_value_verbatim_and_says_what_is_wrong():
    rule = ids.pydantic_rule(ids.check_conversation_id)
    assert rule("cafe\u0301") == "cafe\u0301"  # checked, not rewritten: the CR keeps it
    assert rule(7) == 7  # not a string: pydantic's own type check answers
    with pytest.raises(ValueError, match=r"must not start with '\.'"):
        rule(".x")
