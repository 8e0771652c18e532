"""The pure half of seed 002's table agent (api/chat/table_agent.py): the plan, the
working directory, the files' round trip through bash, the merge back."""

from __future__ import annotations

import json
import subprocess

import pytest

from sandbox_workspace.api.chat.table_agent import (
    BASH_TOOLS,
    FILE_TOOLS,
    make_plan,
    merge_back,
    read_command,
    working_directory,
    write_command,
)
from sandbox_workspace.contract.errors import BadRequest

WS = "/workspace"
TABLE = {"users": [{"name": "ann"}, {"name": "bob"}], "meta": {"v": 1}, "n": None}


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        pytest.param(None, "", id="none"),
        pytest.param("", "", id="empty"),
        pytest.param(".", "", id="dot"),
        pytest.param("uploads/temparea", "uploads/temparea", id="relative"),
        pytest.param("./outputs//x/", "outputs/x", id="normalised"),
        pytest.param("/workspace/c", "", id="absolute-conversation"),
        pytest.param("/workspace/c/", "", id="absolute-conversation-slash"),
        pytest.param("/workspace/c/outputs", "outputs", id="absolute-inside"),
    ],
)
def test_working_directory(value, expected):
    assert working_directory(value, "c", WS) == expected


@pytest.mark.parametrize(
    ("value", "workspace"),
    [
        pytest.param("../other", WS, id="dotdot"),
        pytest.param("outputs/../../x", WS, id="dotdot-inside"),
        pytest.param("/workspace/other", WS, id="other-conversation"),
        pytest.param("/workspace/cc", WS, id="prefix-is-not-inside"),
        pytest.param("/etc", WS, id="system"),
        pytest.param("a\\b", WS, id="backslash"),
        pytest.param("a\x00b", WS, id="nul"),
        pytest.param("/workspace/c", None, id="absolute-without-session"),
    ],
)
def test_working_directory_refused(value, workspace):
    with pytest.raises(BadRequest) as e:
        working_directory(value, "c", workspace)
    assert e.value.code == "invalid_working_directory"


def test_plan_maps_existing_nodes_to_numbered_files_in_order():
    points = [
        {"path": "/meta", "mode": "readonly"},
        {"path": "/users/5", "mode": "full"},  # no node: no file
        {"path": "/users/1", "mode": "full"},
        {"path": "/n", "mode": "full"},  # null exists
    ]
    plan = make_plan(TABLE, points, "", has_table=True)
    assert [(f["file"], f["pointer"], f["mode"], f["node"]) for f in plan["files"]] == [
        ("data.json", "/meta", "readonly", {"v": 1}),
        ("data_2.json", "/users/1", "full", {"name": "bob"}),
        ("data_3.json", "/n", "full", None),
    ]
    assert plan["tools"] == BASH_TOOLS


@pytest.mark.parametrize(
    ("table", "has_table", "points"),
    [
        pytest.param(TABLE, True, [], id="no-points"),
        pytest.param(TABLE, True, [{"path": "/nope", "mode": "full"}], id="missing-node"),
        pytest.param(TABLE, True, [{"path": "/users/-", "mode": "full"}], id="dash"),
        pytest.param(None, False, [{"path": "/", "mode": "full"}], id="no-table"),
    ],
)
def test_plan_without_nodes_offers_the_file_tools(table, has_table, points):
    plan = make_plan(table, points, "outputs", has_table=has_table)
    assert (plan["files"], plan["tools"], plan["root"]) == ([], FILE_TOOLS, "outputs")


@pytest.mark.parametrize(
    ("a", "b"),
    [("/", "/users"), ("/users", "/users/0"), ("/meta", "/meta"), ("", "/")],
)
def test_overlapping_points_are_refused(a, b):
    points = [{"path": a, "mode": "full"}, {"path": b, "mode": "readonly"}]
    with pytest.raises(BadRequest) as e:
        make_plan(TABLE, points, "", has_table=True)
    assert e.value.code == "overlapping_access_points"


@pytest.mark.parametrize(
    "node",
    [{"a": 'it\'s "quoted" $HOME `x` \\ EOF\nSBW_EOF'}, [1, 2.5, None, True], "ünïcødé ☃", 0],
    ids=["shell-hostile", "list", "unicode", "scalar"],
)
def test_write_then_read_round_trips_any_json(tmp_path, node):
    f = {"file": "data.json", "node": node}
    subprocess.run(["bash", "-c", write_command(f)], cwd=tmp_path, check=True)
    out = subprocess.run(
        ["bash", "-c", read_command(f)], cwd=tmp_path, check=True, capture_output=True, text=True
    )
    assert json.loads(out.stdout) == node
    assert [p.name for p in tmp_path.iterdir()] == ["data.json"]  # no temporary left


def _plan(*points):
    return make_plan(TABLE, [{"path": p, "mode": m} for p, m in points], "", has_table=True)


@pytest.mark.parametrize(
    ("points", "contents", "success", "updated", "modified"),
    [
        pytest.param(
            [("/meta", "full")], {"data.json": '{"v": 2}'}, True,
            {**TABLE, "meta": {"v": 2}}, "/meta", id="one-full",
        ),
        pytest.param(
            [("/meta", "full"), ("/users/0", "full")],
            {"data.json": "3", "data_2.json": '{"name": "A"}'}, True,
            {**TABLE, "meta": 3, "users": [{"name": "A"}, {"name": "bob"}]},
            ["/meta", "/users/0"], id="two-full",
        ),
        pytest.param([("/meta", "readonly")], {}, True, None, None, id="readonly-only"),
        pytest.param(
            [("/meta", "full")], {"data.json": "{"}, False, None, None, id="invalid-json",
        ),
        pytest.param([("/meta", "full")], {"data.json": None}, False, None, None, id="deleted"),
        pytest.param([("/", "full")], {"data.json": "[]"}, True, [], "/", id="root"),
    ],
)  # fmt: skip
def test_merge_back(points, contents, success, updated, modified):
    outcome = merge_back(_plan(*points), contents)
    assert (outcome["success"], outcome["updatedData"], outcome["modifiedPath"]) == (
        success,
        updated,
        modified,
    )
    if not success:
        assert "data.json" in outcome["error"]
