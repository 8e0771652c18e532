"""JSON pointers of seed 002's access points (api/chat/json_pointer.py)."""

from __future__ import annotations

import pytest

from sandbox_workspace.api.chat.json_pointer import (
    MISSING,
    PointerError,
    format_pointer,
    merge,
    overlaps,
    parse,
    resolve,
)

DOC = {
    "users": [{"name": "ann", "tags": ["a"]}, {"name": "bob"}],
    "a/b": 1,
    "m~n": 2,
    "": "empty key",
    "n": None,
    "z": 0,
}


@pytest.mark.parametrize(
    ("path", "tokens"),
    [
        pytest.param("", (), id="empty-root"),
        pytest.param("/", (), id="slash-root"),
        pytest.param("/users/0/name", ("users", "0", "name"), id="plain"),
        pytest.param("/a~1b", ("a/b",), id="escape-slash"),
        pytest.param("/m~0n", ("m~n",), id="escape-tilde"),
        pytest.param("/~01", ("~1",), id="tilde-then-one-not-slash"),
        pytest.param("/users/", ("users", ""), id="trailing-empty-token"),
        pytest.param("//x", ("", "x"), id="empty-key"),
    ],
)
def test_parse(path, tokens):
    assert parse(path) == tokens


@pytest.mark.parametrize("path", ["users", "/x~2", "/x~", "/~a"], ids=str)
def test_parse_refuses(path):
    with pytest.raises(PointerError):
        parse(path)


@pytest.mark.parametrize(
    ("path", "node"),
    [
        pytest.param("/", DOC, id="root"),
        pytest.param("/users/1/name", "bob", id="index"),
        pytest.param("/users/0/tags/0", "a", id="nested-index"),
        pytest.param("/a~1b", 1, id="escaped-slash"),
        pytest.param("/m~0n", 2, id="escaped-tilde"),
        pytest.param("/n", None, id="null-exists"),
        pytest.param("/z", 0, id="zero-exists"),
        pytest.param("/users/2", MISSING, id="index-past-end"),
        pytest.param("/users/-", MISSING, id="dash-never-exists"),
        pytest.param("/users/01", MISSING, id="leading-zero"),
        pytest.param("/users/-1", MISSING, id="negative"),
        pytest.param("/users/name", MISSING, id="key-on-array"),
        pytest.param("/nope", MISSING, id="missing-key"),
        pytest.param("/z/x", MISSING, id="into-scalar"),
        pytest.param("/users/0/name/x", MISSING, id="into-string"),
    ],
)
def test_resolve(path, node):
    assert resolve(DOC, parse(path)) == node


@pytest.mark.parametrize(
    ("path", "value", "check"),
    [
        pytest.param("/", [1], lambda d: d == [1], id="root-replaced"),
        pytest.param(
            "/users/0/name", "ANN", lambda d: d["users"][0]["name"] == "ANN", id="index-key"
        ),
        pytest.param(
            "/users/1", {"name": "B"}, lambda d: d["users"][1] == {"name": "B"}, id="array-item"
        ),
        pytest.param("/users/-", {"x": 1}, lambda d: d["users"][-1] == {"x": 1}, id="dash-appends"),
        pytest.param("/a~1b", 5, lambda d: d["a/b"] == 5, id="escaped"),
        pytest.param("/new", True, lambda d: d["new"] is True, id="new-key-in-object"),
        pytest.param(
            "/users/0", {"name": "ann"}, lambda d: "tags" not in d["users"][0], id="replaced-whole"
        ),
    ],
)
def test_merge(path, value, check):
    before = copy_of(DOC)
    after = merge(DOC, parse(path), value)
    assert check(after)
    assert before == DOC  # the input is not modified


@pytest.mark.parametrize(
    "path", ["/users/5", "/users/01", "/nope/x", "/z/x", "/users/0/name/x"], ids=str
)
def test_merge_refuses_what_it_cannot_place(path):
    with pytest.raises(PointerError):
        merge(DOC, parse(path), 1)


def test_merge_copies_the_value():
    value = {"k": [1]}
    after = merge(DOC, parse("/v"), value)
    value["k"].append(2)
    assert after["v"] == {"k": [1]}


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        ("/", "/users", True),
        ("/users/0", "/users/0/name", True),
        ("/users/0", "/users/1", False),
        ("/users/1", "/users/10", False),
        ("/a", "/a", True),
    ],
)
def test_overlaps(a, b, expected):
    assert overlaps(parse(a), parse(b)) is expected


@pytest.mark.parametrize("path", ["/", "/users/0/name", "/a~1b/~0"], ids=str)
def test_format_round_trips(path):
    assert format_pointer(parse(path)) == path


def copy_of(doc):
    import copy

    return copy.deepcopy(doc)
