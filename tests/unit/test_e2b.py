"""The pure parts of E2B compatibility: Connect framing, paths, tokens, results."""

from __future__ import annotations

import pytest

from sandbox_workspace.api.e2b import connect
from sandbox_workspace.api.e2b.envd import mark_main, result_line
from sandbox_workspace.api.e2b.ids import (
    AccessTokens,
    E2BUnauthorized,
    dev_caller_for_api_key,
    sandbox_of,
    well_formed_key,
)
from sandbox_workspace.api.e2b.paths import to_e2b, to_relative
from sandbox_workspace.api.e2b.processes import command_of
from sandbox_workspace.api.identity import Caller
from sandbox_workspace.contract.errors import ApiError, BadRequest


def test_connect_envelopes_round_trip_and_end_the_stream():
    body = connect.envelope({"a": 1}) + connect.end_stream("not_found", "gone")
    assert body[:5] == b"\x00\x00\x00\x00\x07"
    assert connect.read_envelopes(body) == [
        (0, {"a": 1}),
        (connect.END_STREAM, {"error": {"code": "not_found", "message": "gone"}}),
    ]
    assert connect.read_envelopes(connect.end_stream()) == [(2, {})]
    with pytest.raises(BadRequest, match="declares 47 bytes, 46 follow"):
        connect.read_envelopes(body[:-1])


@pytest.mark.parametrize(
    ("body", "says"),
    [
        pytest.param(b"\x00\xff\xff\xff\xff", "declares 4294967295 bytes, 0 follow", id="2^32-1"),
        pytest.param(b"\x00\x00", "envelope header", id="short-header"),
        pytest.param(b"", "has 0", id="none"),
        pytest.param(connect.envelope({}) * 2, "has 2", id="two"),
        pytest.param(connect.envelope({}, 0x02), "flags 0x02", id="end-stream"),
        pytest.param(connect.envelope({}, 0x01), "compressed", id="compressed"),
        pytest.param(connect.envelope([]), "JSON object", id="array"),  # type: ignore[arg-type]
    ],
)
def test_a_stream_request_is_one_plain_envelope_of_one_object(body, says):
    with pytest.raises(ApiError, match=says):
        connect.request_message(body)


def test_a_stream_request_message():
    assert connect.request_message(connect.envelope({"a": 1})) == {"a": 1}
    assert connect.request_message(b"\x00\x00\x00\x00\x00") == {}  # the empty message
    with pytest.raises(connect.Unimplemented, match="br"):
        connect.request_message(connect.envelope({}), "br")


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        (b"[" * 100_000 + b"]" * 100_000, "nests too deep"),
        (b'{"a": NaN}', "NaN is not JSON"),
        (b'{"a": -Infinity}', "-Infinity is not JSON"),
        (b'{"a": 1e999}', "out of range"),
        (b'"x"', "not str"),
        (b"\xff", "not JSON"),
    ],
)
def test_a_message_is_one_json_object_of_finite_numbers(raw, says):
    with pytest.raises(BadRequest, match=says):
        connect.message_of(raw)


def test_fields_name_what_is_wrong():
    assert connect.field({"a": None}, "a", str, "d") == "d"
    with pytest.raises(BadRequest, match="'a' must be a string"):
        connect.field({"a": 1}, "a", str)
    with pytest.raises(BadRequest, match="'n' must be a whole number"):
        connect.field({"n": True}, "n", int)
    assert connect.whole({"n": "7"}, "n", 0, 1, 9) == 7
    for bad in (0, 10, 1.5, "x", True, "9" * 30):
        with pytest.raises(BadRequest, match="from 1 to 9"):
            connect.whole({"n": bad}, "n", 0, 1, 9)
    assert connect.timeout_seconds(None) is None and connect.timeout_seconds("0") is None
    assert connect.timeout_seconds("1500") == 1.5
    for bad in ("-1", "1e3", "9" * 11, "１"):
        with pytest.raises(BadRequest, match="Connect-Timeout-Ms"):
            connect.timeout_seconds(bad)


def test_connect_codes_for_statuses():
    assert connect.code_for_status(404) == "not_found"
    assert connect.code_for_status(418) == "invalid_argument"
    assert connect.code_for_status(502) == "internal"


@pytest.mark.parametrize(
    ("given", "relative"),
    [
        ("/home/user", ""),
        ("", ""),
        ("~/a", "a"),
        ("/home/user/a/b.txt", "a/b.txt"),
        ("a//./b", "a/b"),
    ],
)
def test_home_and_relative_paths_name_the_conversation(given, relative):
    assert to_relative(given) == relative
    assert to_e2b(relative) == ("/home/user/" + relative if relative else "/home/user")


@pytest.mark.parametrize(
    ("given", "says"),
    [
        ("/etc/passwd", "outside"),
        ("/home/userx", "outside"),
        ("a/../../b", "'..'"),
        ("/home/user/..", "'..'"),
        ("a\x00b", "NUL"),
        ("a\ud800", "valid Unicode"),
        (5, "must be a string"),
        (["a"], "must be a string"),
        ("n" * 4097, "File name too long"),
        ("/".join(["d"] * 10_000), "File name too long"),
    ],
)
def test_other_paths_are_refused(given, says):
    with pytest.raises(BadRequest, match=says):
        to_relative(given)


def test_a_path_of_path_max_is_passed_on():
    assert to_relative("n" * 4096) == "n" * 4096


def test_access_tokens_name_their_caller_and_sandbox_only():
    tokens = AccessTokens(b"k")
    caller = Caller("alice", "e2b-key", "acme")
    token = tokens.issue(caller, "0" * 20)
    assert tokens.verify(token, "0" * 20) == (Caller("alice", "e2b-token", "acme"), "0" * 20)
    for bad_token, sandbox in [(token, "1" * 20), (token + "0", "0" * 20), (None, "0" * 20)]:
        with pytest.raises(E2BUnauthorized):
            tokens.verify(bad_token, sandbox)
    with pytest.raises(E2BUnauthorized):
        AccessTokens(b"other").verify(token, "0" * 20)


def test_api_keys_have_e2b_form_and_each_dev_key_is_one_user():
    assert dev_caller_for_api_key("e2b_00ff00ff").user_id.startswith("e2b-")
    assert dev_caller_for_api_key("e2b_00ff00ff") != dev_caller_for_api_key("e2b_11ff00ff")
    assert well_formed_key("e2b_00ff00ff") == "e2b_00ff00ff"
    for key in ["sk-123", None, "e2b_XYZ"]:
        with pytest.raises(E2BUnauthorized):
            well_formed_key(key)


def test_only_e2b_conversations_are_sandboxes():
    assert sandbox_of("e2b-" + "a" * 20) == "a" * 20
    assert sandbox_of("chat-1") is None and sandbox_of("e2b-short") is None


def test_commands_keep_the_sdks_shell_form_env_and_cwd():
    assert command_of({"cmd": "/bin/bash", "args": ["-l", "-c", "ls -l"]}) == "ls -l"
    assert command_of({"cmd": "ls", "args": ["a b"]}) == "ls 'a b'"
    code = command_of(
        {"cmd": "/bin/bash", "args": ["-c", "pwd"], "envs": {"A": "x y"}, "cwd": "/home/user/d"}
    )
    assert code == "export A='x y'\ncd d\npwd"


def test_main_result_is_the_last_expression_before_figures():
    figure = result_line({"text/plain": "<Figure size 640x480>", "image/png": "iVBO"})
    value = result_line({"text/plain": "42"})
    lines = mark_main([value, figure], "x = 1\nx + 41")
    assert [line["is_main_result"] for line in lines] == [True, False]
    assert value["text"] == "42" and figure["png"] == "iVBO"
    plain = [result_line({"text/plain": "1"})]
    assert mark_main(plain, "x = 1")[0]["is_main_result"] is False


def test_timeouts_are_numbers_and_idempotency_is_bounded():
    import asyncio

    from sandbox_workspace.api.e2b import lifetimes
    from sandbox_workspace.api.e2b.control import DEFAULT_TIMEOUT, timeout_of
    from sandbox_workspace.contract.errors import BadRequest

    assert timeout_of(None) == timeout_of({}) == DEFAULT_TIMEOUT
    assert timeout_of({"timeout": 2}) == 2
    assert timeout_of({"timeout": 1e300}) == timeout_of({"timeout": 10**30}) == 86_400
    for bad in ("10", True, -1, [1], float("nan"), float("inf"), float("-inf")):
        with pytest.raises(BadRequest):
            timeout_of({"timeout": bad})

    remembered = lifetimes.Idempotency()
    caller = Caller("u", "e2b-key")

    async def fill() -> None:
        for i in range(lifetimes.MAX_REMEMBERED + 50):
            await remembered.once(caller, f"k{i}", {}, lambda i=i: _answer(i))

    async def _answer(i):
        return i

    asyncio.run(fill())
    assert len(remembered._answers) == lifetimes.MAX_REMEMBERED


def test_key_records_in_a_secret_keep_hashes_only_and_survive_a_concurrent_write(tmp_path):
    """The kubernetes backend's store (one Secret, resourceVersion-guarded) and the local
    one (a 0600 file) keep the same records; neither holds the key itself."""
    import asyncio
    import base64
    import json

    from fake_kube import FakeKube

    from sandbox_workspace.api.e2b.keys import FileRecords, SecretRecords, key_hash, owner_of

    kube = FakeKube()
    stores = [SecretRecords(kube, "sessions"), FileRecords(tmp_path / "keys.json")]
    record = {"id": "1", "tenant": "acme", "user": "alice", "created": "t"}

    async def scenario(store) -> None:
        await store.update(lambda r: r.__setitem__(key_hash("e2b_aa"), record))
        await store.update(lambda r: r.__setitem__(key_hash("e2b_bb"), {**record, "id": "2"}))
        assert await owner_of(store, "e2b_aa") == Caller("alice", "e2b-key", "acme")
        await store.update(lambda r: r.pop(key_hash("e2b_aa")))
        if isinstance(store, SecretRecords):
            store._cached = None
        assert await owner_of(store, "e2b_aa") is None
        assert (await owner_of(store, "e2b_bb")).user_id == "alice"

    for store in stores:
        asyncio.run(scenario(store))
    secret = kube.objects["/api/v1/namespaces/sessions/secrets/sandbox-workspace-e2b-keys"]
    assert list(secret["data"]) == [key_hash("e2b_bb")]
    assert (
        "e2b_bb"
        not in json.dumps(secret) + base64.b64decode(secret["data"][key_hash("e2b_bb")]).decode()
    )
    assert (tmp_path / "keys.json").stat().st_mode & 0o077 == 0

    # Another replica writes between our read and our write: ours is retried, both stay.
    first = SecretRecords(kube, "sessions")
    original_get = first._get

    async def read_then_race():
        answer = await original_get()
        other = SecretRecords(kube, "sessions")
        if not hasattr(read_then_race, "raced"):
            read_then_race.raced = True
            await other.update(lambda r: r.__setitem__("h-other", {**record, "id": "o"}))
        return answer

    first._get = read_then_race
    asyncio.run(first.update(lambda r: r.__setitem__("h-mine", {**record, "id": "m"})))
    secret = kube.objects["/api/v1/namespaces/sessions/secrets/sandbox-workspace-e2b-keys"]
    assert {"h-other", "h-mine"} <= set(secret["data"])


def test_timers_are_per_owner_so_the_same_attached_id_never_crosses_users():
    """Attached ids are the conversation id encoded: two users attaching their own
    ``chat-7`` share the id, never a timer (a kill or a short timeout of one once
    detached the other's)."""
    import asyncio

    from sandbox_workspace.api.e2b import lifetimes
    from sandbox_workspace.api.e2b.ids import attached_sandbox_id

    sid = attached_sandbox_id("chat-7")
    alice, bob = Caller("alice", "e2b-key"), Caller("bob", "e2b-key")
    other_tenant = Caller("alice", "e2b-key", "globex")
    timers = lifetimes.Lifetimes()

    async def play() -> list:
        await timers.set(alice, sid, 600)
        await timers.set(bob, sid, 1)
        await timers.forget(bob, sid)
        await timers.set(alice, sid, 5, extend_only=True)  # connect never shortens
        return [await timers.remaining(c, sid) for c in (alice, bob, other_tenant)]

    left_alice, left_bob, left_other = asyncio.run(play())
    assert 590 < left_alice <= 600 and left_bob is None and left_other is None


@pytest.mark.parametrize(
    ("cell", "kept_lines"),
    [
        ("x = 1\nx + 1", True),
        ("# a comment\nx = 1", True),
        ("\nx = 1", True),
        ('s = """a\nb"""\ns', True),
        ("def f():\n    return 1\nf()", False),  # a block first: on a line of its own
        ("@decorator\ndef f(): pass", False),
        ("x = (", False),  # a syntax error stays one, one line further
    ],
)
def test_python_cells_start_in_home_keeping_their_line_numbers(cell, kept_lines):
    from sandbox_workspace.api.e2b.conversation import PY_HOME, python_in_home

    code = python_in_home(cell)
    assert code.startswith(PY_HOME)
    assert code.count("\n") == cell.count("\n") + (0 if kept_lines else 1)
    if "(" not in cell.rstrip()[-1:]:
        compile(code, "<cell>", "exec")
    future = "from __future__ import annotations\nx = 1"
    assert python_in_home(future) == future  # must stay first: the cell keeps its cwd


def test_the_home_setup_goes_to_outputs_once_per_interpreter(tmp_path, monkeypatch):
    """What the kernel runs: the first cell goes to outputs/ (made), sets HOME and the
    import path; a later cell leaves a directory the code chose alone."""
    import os

    from sandbox_workspace.api.e2b.conversation import python_in_home

    monkeypatch.setenv("WORKSPACE_DIR", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("sys.path", list(__import__("sys").path))
    namespace: dict = {}
    exec(python_in_home("import os\nos.makedirs('elsewhere')"), namespace)
    assert os.getcwd() == str(tmp_path / "outputs") == os.environ["HOME"]
    os.chdir("elsewhere")
    exec(python_in_home("y = 2"), namespace)
    assert os.getcwd() == str(tmp_path / "outputs" / "elsewhere")
    assert set(namespace) - {"__builtins__"} == {"__e2b_home__", "os", "y"}
