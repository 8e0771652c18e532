"""E2B's wire surface under hostile input, by raw HTTP against a real dev server.

The rule: nothing a client sends gets a 5xx, hangs the API or costs it memory out of
proportion; every refusal is a 4xx (or, on a stream, the Connect error the SDK maps to
the right exception) whose message says what to change; nothing crosses users. Rows:
Connect framing and messages (unary and streams), paths, ``Connect-Timeout-Ms``, the
control plane's fields, ids and headers, and streams dropped or never read (the API's
fds and peak RSS watched through /proc). Symlinks made by code are
``test_e2b_hostile.py``'s; body size and trickle bounds on every route are
``test_request_bounds.py``'s (here: one row each on envd's routes).
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import struct
import time
from pathlib import Path

import httpx
import pytest
from rss_watch import PeakWatch

pytestmark = [pytest.mark.local_backend, pytest.mark.timeout(60)]

KEY = "e2b_" + "f0" * 16
OTHER_KEY = "e2b_" + "0f" * 16
DEEP = b"[" * 100_000 + b"]" * 100_000
JSON = "application/json"
STREAM = "application/connect+json"


@pytest.fixture(scope="module")
def server(start_server):
    return start_server(
        "dev",
        "--data-dir",
        "data",
        SANDBOX_WORKSPACE_SANDBOX_MOUNT="none",
        SANDBOX_WORKSPACE_BOUNDS__BODY_TIMEOUT_SECONDS="2",
    )


def _create(server, key: str = KEY, **body) -> httpx.Response:
    return httpx.post(
        f"{server.url}/e2b/v2/sandboxes",
        json={"templateID": "base", **body},
        headers={"X-API-Key": key},
        timeout=60,
    )


@pytest.fixture(scope="module")
def sandbox(server):
    """One sandbox of ``KEY``'s user: (its id, the envd headers that reach it)."""
    made = _create(server)
    assert made.status_code == 201, made.text
    sid = made.json()["sandboxID"]
    headers = {"X-Access-Token": made.json()["envdAccessToken"], "E2b-Sandbox-Id": sid}
    yield sid, headers
    httpx.delete(f"{server.url}/e2b/sandboxes/{sid}", headers={"X-API-Key": KEY}, timeout=60)


def frame(message: bytes, flags: int = 0) -> bytes:
    return struct.pack(">BI", flags, len(message)) + message


def _envd(server, sandbox, rpc: str, body: bytes, content_type: str = JSON, **headers):
    _, reach = sandbox
    return httpx.post(
        f"{server.url}/e2b/envd/{rpc}",
        content=body,
        headers={**reach, "Content-Type": content_type, **headers},
        timeout=30,
    )


def _frames(body: bytes) -> list[tuple[int, dict]]:
    out, at = [], 0
    while at < len(body):
        flags, size = struct.unpack_from(">BI", body, at)
        out.append((flags, json.loads(body[at + 5 : at + 5 + size])))
        at += 5 + size
    return out


def _stream_error(answer: httpx.Response) -> dict:
    """The error of a stream that must end at once with one (HTTP 200, envelope 0x02)."""
    assert answer.status_code == 200, answer.text
    frames = _frames(answer.content)
    assert len(frames) == 1 and frames[0][0] == 0x02, frames
    return frames[0][1]["error"]


# -- unary Connect calls: messages and paths ----------------------------------------------

STAT = "filesystem.Filesystem/Stat"
LIST = "filesystem.Filesystem/ListDir"
SIGNAL = "process.Process/SendSignal"
WATCHER = "filesystem.Filesystem/CreateWatcher"
MOVE, MKDIR = "filesystem.Filesystem/Move", "filesystem.Filesystem/MakeDir"
INPUT = "process.Process/SendInput"


def unary(body: bytes, says: str, name: str, rpc: str = STAT, content_type: str = JSON):
    return pytest.param(rpc, body, content_type, says, id=name)


def path(value: object) -> bytes:
    return json.dumps({"path": value}).encode()


UNARY_ROWS = [
    unary(b"[]", "must be a JSON object", "array-not-object"),
    unary(b"nope", "not JSON", "not-json"),
    unary(DEEP, "nests too deep", "nested-100000"),
    unary(b'{"path": "\xff\xfe"}', "not JSON", "invalid-utf8"),
    unary(path(5), "path must be a string", "path-int"),
    unary(path(["a"]), "path must be a string", "path-list"),
    unary(path("a\x00b"), "NUL", "path-nul"),
    unary(b'{"path": "\\ud800"}', "valid Unicode", "path-lone-surrogate"),
    unary(path("../x"), "'..'", "path-dotdot"),
    unary(path("a/../../x"), "'..'", "path-dotdot-inner"),
    unary(path("/etc/passwd"), "outside", "path-absolute"),
    unary(path("/home/user/../x"), "'..'", "path-home-dotdot"),
    unary(path("a" * 5000), "too long", "name-5000"),
    unary(path("/".join(["d"] * 10_000)), "too long", "components-10000"),
    unary(path("d/" * 100_000), "too long", "path-200k"),
    unary(b'{"depth": Infinity}', "finite", "depth-infinity", LIST),
    unary(b'{"depth": NaN}', "finite", "depth-nan", LIST),
    unary(b'{"depth": 1e400}', "out of range", "depth-1e400", LIST),
    unary(b'{"depth": ' + b"9" * 100 + b"}", "'depth' must be a whole number", "depth-huge", LIST),
    unary(b'{"depth": "x"}', "'depth' must be a whole number", "depth-str", LIST),
    unary(b'{"source": 1, "destination": "x"}', "path must be", "move-int", MOVE),
    unary(b"\n\x01a", "JSON codec only", "proto", MKDIR, "application/proto"),
    unary(b"[]", "JSON object", "list-array", "process.Process/List"),
    unary(b'{"process": {"pid": Infinity}, "signal": 9}', "finite", "pid-infinity", SIGNAL),
    unary(b'{"process": {"pid": 1' + b"0" * 30 + b'}, "signal": 9}', "'pid'", "pid-huge", SIGNAL),
    unary(b'{"process": {"pid": -1}, "signal": 9}', "'pid' must be", "pid-negative", SIGNAL),
    unary(b'{"process": "x", "signal": 9}', "'process' must be an object", "process-str", SIGNAL),
    unary(b'{"process": {"pid": 1}, "signal": []}', "SIGTERM or SIGKILL", "signal-list", SIGNAL),
    unary(b'{"process": {"pid": 1}, "input": "x"}', "'input' must be", "input-str", INPUT),
    unary(b"[1]", "JSON object", "watcher-array", WATCHER),
    unary(path({"a": 1}), "path must be a string", "watcher-path-object", WATCHER),
]  # fmt: skip


@pytest.mark.parametrize(("rpc", "body", "content_type", "says"), UNARY_ROWS)
def test_a_unary_rpc_refuses_hostile_messages_with_a_4xx_that_says_why(
    server, sandbox, rpc, body, content_type, says
):
    answer = _envd(server, sandbox, rpc, body, content_type)
    assert 400 <= answer.status_code < 500, (answer.status_code, answer.text)
    error = answer.json()
    assert error["code"] in ("invalid_argument", "unimplemented"), error
    assert says in error["message"], error


def test_unknown_rpcs_services_and_get_are_told_apart(server, sandbox):
    nope = _envd(server, sandbox, "filesystem.Filesystem/Nope", b"{}")
    assert (nope.status_code, nope.json()["code"]) == (501, "unimplemented")
    other = _envd(server, sandbox, "foo.Bar/Baz", b"{}")
    assert other.status_code == 501 and "not supported" in other.json()["message"]
    got = httpx.get(f"{server.url}/e2b/envd/process.Process/List", headers=sandbox[1], timeout=30)
    assert got.status_code == 405 and "POST" in got.json()["message"], got.text


# -- server streams: framing and messages --------------------------------------------------

START = "process.Process/Start"
CONNECT = "process.Process/Connect"
WATCH = "filesystem.Filesystem/WatchDir"
ECHO = b'{"process": {"cmd": "echo", "args": ["hi"]}}'
TIMEOUT = "Connect-Timeout-Ms"


def row(body: bytes, says: str, name: str, rpc: str = START, **headers: str):
    return pytest.param(rpc, body, headers, says, id=name)


def process(**config) -> bytes:
    return frame(json.dumps({"process": config}).encode())


STREAM_ROWS = [
    row(struct.pack(">BI", 0, 2**32 - 1), "declares 4294967295", "len-2^32-1"),
    row(struct.pack(">BI", 0, 10**6) + b"{}", "truncated", "len-beyond-body"),
    row(b"\x00\x00", "truncated Connect envelope header", "truncated-header"),
    row(b"", "has 0", "no-envelope"),
    row(frame(ECHO) + frame(ECHO), "has 2", "two-messages"),
    row(frame(ECHO, 0x02), "flags 0x02", "end-stream-flag"),
    row(frame(ECHO, 0x80), "flags 0x80", "unknown-flag"),
    row(frame(ECHO, 0x01), "compressed", "compressed-no-encoding"),
    row(frame(ECHO, 0x01), "gzip", "gzip", **{"Connect-Content-Encoding": "gzip"}),
    row(frame(b"[]"), "JSON object", "array"),
    row(frame(b""), "by pid", "zero-length", CONNECT),
    row(frame(DEEP), "nests too deep", "nested-100000"),
    row(frame(b'{"process": "x"}'), "'process' must be an object", "process-str"),
    row(process(cmd=3), "'cmd' must be a string", "cmd-int"),
    row(process(cmd="a", args=[1]), "list of strings", "args-int"),
    row(process(cmd="a", envs=[1]), "'envs' must be an object", "envs-list"),
    row(process(cmd="a", envs={"a b;x": "1"}), "variable names", "envs-name"),
    row(process(cmd="a", envs={"A": 1}), "variable names", "envs-value-int"),
    row(process(cmd="echo", args=["a\x00b"]), "NUL", "args-nul"),
    row(process(cmd="echo", envs={"A": "x\x00y"}), "NUL", "envs-value-nul"),
    row(frame(b'{"process": {"cmd": "echo", "args": ["\\ud800"]}}'), "unicode", "args-surrogate"),
    row(process(cmd="x" * 300_000), "larger than", "cmd-300k"),
    row(process(cmd="echo", envs={f"K{i}": "v" for i in range(100_000)}), "larger", "envs-100000"),
    row(process(cmd="a", cwd=3), "path must be a string", "cwd-int"),
    row(process(cmd="a", cwd="/etc"), "outside", "cwd-outside"),
    row(frame(b'{"process": {"cmd": "\xff"}}'), "not JSON", "invalid-utf8"),
    row(frame(ECHO), TIMEOUT, "timeout-negative", **{TIMEOUT: "-1"}),
    row(frame(ECHO), TIMEOUT, "timeout-float", **{TIMEOUT: "1e3"}),
    row(frame(ECHO), TIMEOUT, "timeout-11-digits", **{TIMEOUT: "9" * 11}),
    row(frame(ECHO), TIMEOUT, "timeout-huge", **{TIMEOUT: "9" * 5000}),
    row(
        frame(ECHO),
        "JSON codec only",
        "proto-codec",
        **{"Content-Type": "application/connect+proto"},
    ),
    row(frame(b'{"process": {"pid": Infinity}}'), "finite", "pid-infinity", CONNECT),
    row(frame(b'{"process": {"pid": 1e300}}'), "'pid' must be", "pid-1e300", CONNECT),
    row(frame(b"[]"), "JSON object", "watch-array", WATCH),
    row(frame(b'{"path": 1}'), "path must be a string", "watch-path-int", WATCH),
    row(frame(b'{"path": "../.."}'), "'..'", "watch-dotdot", WATCH),
]


@pytest.mark.parametrize(("rpc", "body", "headers", "says"), STREAM_ROWS)
def test_a_stream_rpc_refuses_hostile_frames_with_one_connect_error(
    server, sandbox, rpc, body, headers, says
):
    error = _stream_error(_envd(server, sandbox, rpc, body, STREAM, **headers))
    assert error["code"] in ("invalid_argument", "unimplemented"), error
    assert says in error["message"], error


def test_empty_messages_unknown_fields_and_the_largest_timeout_are_valid(server, sandbox):
    # Ten digits is the protocol's largest timeout; the runtime clamps it to its own
    # bound on a process's life. An empty body is the empty message (proto's defaults).
    answer = _envd(server, sandbox, START, frame(ECHO), STREAM, **{"Connect-Timeout-Ms": "9" * 10})
    assert answer.status_code == 200 and _frames(answer.content)[-1] == (0x02, {})
    listed = _envd(server, sandbox, "process.Process/List", b"")
    assert listed.status_code == 200, listed.text
    # Unknown fields are ignored, as protobuf's JSON codec does for a newer client.
    stat = _envd(server, sandbox, STAT, b'{"path": "", "unknown": {"x": [1]}}')
    assert stat.status_code == 200 and stat.json()["entry"]["path"] == "/home/user"


def test_the_code_interpreter_refuses_hostile_bodies(server, sandbox):
    for body, says in [
        (b"[]", "JSON object"),
        (DEEP, "nests too deep"),
        (b'{"code": 5}', "'code' must be a string"),
        (b'{"code": "1", "language": 5}', "'language' must be a string"),
        (b'{"code": "1", "language": "cobol"}', "python/bash"),
    ]:
        answer = _envd(server, sandbox, "execute", body)
        assert 400 <= answer.status_code < 502, answer.text
        assert says in answer.json()["message"], (body[:40], answer.text)


# -- /files -----------------------------------------------------------------------------------

FILES_PATHS = [
    pytest.param("../x", "'..'", id="dotdot"),
    pytest.param("/etc/passwd", "outside", id="absolute"),
    pytest.param("a\x00b", "NUL", id="nul"),
    pytest.param("n" * 5000, "too long", id="name-5000"),
    pytest.param("/".join(["d"] * 10_000), "too long", id="components-10000"),
]


@pytest.mark.parametrize(("path", "says"), FILES_PATHS)
def test_files_refuse_hostile_paths(server, sandbox, path, says):
    url = f"{server.url}/e2b/envd/files"
    read = httpx.get(url, params={"path": path}, headers=sandbox[1], timeout=30)
    write = httpx.post(
        url,
        params={"path": path},
        content=b"x",
        headers={**sandbox[1], "Content-Type": "application/octet-stream"},
        timeout=30,
    )
    for answer in (read, write):
        assert answer.status_code == 400, (answer.status_code, answer.text)
        assert says in answer.json()["message"], answer.text
    # A multipart file name: httpx escapes NUL (a%00b, a harmless name); a name past
    # the multipart parser's bound is its 400 ("Invalid multipart data").
    named = httpx.post(url, files={"file": (path, b"x")}, headers=sandbox[1], timeout=30)
    assert named.status_code == (200 if "\x00" in path else 400), named.text


# -- control plane ------------------------------------------------------------------------------


CREATE_ROWS = [
    pytest.param(b'{"timeout": NaN}', "NaN is not JSON", id="timeout-nan"),
    pytest.param(b'{"timeout": Infinity}', "Infinity is not JSON", id="timeout-infinity"),
    pytest.param(b'{"timeout": 1e999}', "out of range", id="timeout-1e999"),
    pytest.param(b'{"timeout": -1}', "timeout", id="timeout-negative"),
    pytest.param(b'{"timeout": "5"}', "timeout", id="timeout-str"),
    pytest.param(
        json.dumps({"templateID": "t" * 10_000}).encode(), "not available", id="template-10k"
    ),
    pytest.param(b'{"templateID": [1]}', "not available", id="template-list"),
    pytest.param(b'{"metadata": [1]}', "string values", id="metadata-list"),
    pytest.param(b'{"metadata": "x"}', "string values", id="metadata-str"),
    pytest.param(b'{"metadata": {"a": {"b": 1}}}', "string values", id="metadata-nested"),
    pytest.param(
        json.dumps({"metadata": {f"k{i}": "v" for i in range(100_000)}}).encode(),
        "at most 65536",
        id="metadata-100000-keys",
    ),
    pytest.param(
        json.dumps({"metadata": {"k": "v" * 7_000_000}}).encode(), "at most", id="metadata-7MB"
    ),
    pytest.param(b"[" * 100_000 + b"]" * 100_000, "nests too deep", id="nested-100000"),
    pytest.param(b'{"templateID": "\xff"}', "the body is not JSON", id="invalid-utf8"),
    pytest.param(b"[]", "the body must be a JSON object", id="array"),
]  # fmt: skip


@pytest.mark.parametrize(("body", "says"), CREATE_ROWS)
def test_create_refuses_hostile_fields_with_a_4xx(server, body, says):
    answer = httpx.post(
        f"{server.url}/e2b/v2/sandboxes",
        content=body,
        headers={"X-API-Key": KEY, "Content-Type": JSON},
        timeout=60,
    )
    assert answer.status_code == 400, (answer.status_code, answer.text[:300])
    assert says in answer.json()["message"], answer.text[:300]  # E2B's {code, message}
    assert len(answer.content) < 2000  # a 10 KB template id is not echoed whole


@pytest.mark.parametrize("body", [{"timeout": 1e300}, {"timeout": 0}, {"timeout": 10**30}])
def test_huge_and_zero_timeouts_are_clamped_not_a_server_error(server, sandbox, body):
    sid, _ = sandbox
    made = _create(server, **body)
    assert made.status_code == 201, made.text
    httpx.delete(
        f"{server.url}/e2b/sandboxes/{made.json()['sandboxID']}",
        headers={"X-API-Key": KEY},
        timeout=60,
    )
    for path in (f"/e2b/sandboxes/{sid}/timeout", f"/e2b/sandboxes/{sid}/connect"):
        answer = httpx.post(server.url + path, json=body, headers={"X-API-Key": KEY}, timeout=60)
        assert answer.status_code in (200, 204), answer.text
    nan = httpx.post(
        f"{server.url}/e2b/sandboxes/{sid}/timeout",
        content=b'{"timeout": NaN}',
        headers={"X-API-Key": KEY, "Content-Type": JSON},
        timeout=60,
    )
    assert nan.status_code == 400 and "NaN" in nan.json()["message"]


def test_another_users_sandbox_is_a_missing_one(server, sandbox):
    """Same 404, same text (but the id) as an id nobody has; and it is unharmed."""
    sid, _ = sandbox
    missing = "0" * 20
    for method, tail, body in [
        ("GET", "", None),
        ("POST", "/timeout", {"timeout": 1}),
        ("POST", "/connect", {"timeout": 1}),
        ("DELETE", "", None),
    ]:
        texts = []
        for target in (sid, missing):
            answer = httpx.request(
                method,
                f"{server.url}/e2b/sandboxes/{target}{tail}",
                json=body,
                headers={"X-API-Key": OTHER_KEY},
                timeout=60,
            )
            assert answer.status_code == 404, (method, tail, answer.text)
            texts.append(answer.json()["message"].replace(target, "ID"))
        assert texts[0] == texts[1], (method, tail, texts)
    mine = httpx.get(f"{server.url}/e2b/sandboxes/{sid}", headers={"X-API-Key": KEY}, timeout=60)
    assert mine.status_code == 200, mine.text
    # Their envd token does not open it either.
    theirs = _create(server, key=OTHER_KEY).json()
    try:
        foreign = {"X-Access-Token": theirs["envdAccessToken"], "E2b-Sandbox-Id": sid}
        answer = httpx.post(f"{server.url}/e2b/envd/{STAT}", json={}, headers=foreign, timeout=30)
        assert answer.status_code == 401 and "another sandbox" in answer.json()["message"]
    finally:
        httpx.delete(
            f"{server.url}/e2b/sandboxes/{theirs['sandboxID']}",
            headers={"X-API-Key": OTHER_KEY},
            timeout=60,
        )


def test_another_sandboxs_processes_and_watchers_are_not_found(server, sandbox):
    """A second sandbox of the same user names the first one's pid and watcher id: the
    same 404 as a pid or id nobody has, and the first one's process lives on."""
    pid = _start(server, sandbox, "echo up; sleep 30")
    watcher = _envd(server, sandbox, WATCHER, b'{"path": ""}').json()["watcherId"]
    made = _create(server).json()
    sid = made["sandboxID"]
    other = (sid, {"X-Access-Token": made["envdAccessToken"], "E2b-Sandbox-Id": sid})

    def signal(target: int) -> httpx.Response:
        message = {"process": {"pid": target}, "signal": "SIGNAL_SIGKILL"}
        return _envd(server, other, SIGNAL, json.dumps(message).encode())

    def events(target: str) -> httpx.Response:
        message = json.dumps({"watcherId": target}).encode()
        return _envd(server, other, "filesystem.Filesystem/GetWatcherEvents", message)

    try:
        for call, victim, nobody in [(signal, pid, 4_000_000), (events, watcher, "x" * 16)]:
            texts = []
            for target in (victim, nobody):
                answer = call(target)
                assert answer.status_code == 404, answer.text
                texts.append(answer.json()["message"].replace(str(target), "ID"))
            assert texts[0] == texts[1], texts
        follow = frame(json.dumps({"process": {"pid": pid}}).encode())
        assert _stream_error(_envd(server, other, CONNECT, follow, STREAM))["code"] == "not_found"
        listed = _envd(server, sandbox, "process.Process/List", b"{}").json()["processes"]
        assert pid in [p["pid"] for p in listed]  # untouched
    finally:
        _kill(server, sandbox, pid)
        remove = json.dumps({"watcherId": watcher}).encode()
        _envd(server, sandbox, "filesystem.Filesystem/RemoveWatcher", remove)
        httpx.delete(f"{server.url}/e2b/sandboxes/{sid}", headers={"X-API-Key": KEY}, timeout=60)


@pytest.mark.parametrize(
    "sandbox_id",
    [
        pytest.param("a%2Fb", id="encoded-slash"),
        pytest.param("..%2F..%2Fx", id="encoded-dotdot"),
        pytest.param("０" * 20, id="fullwidth-digits"),
        pytest.param("a" * 10_000, id="10k"),
        pytest.param("conv" + "a" * 400, id="attached-huge"),
        pytest.param("conva", id="attached-not-base32"),
        pytest.param("conv7777777", id="attached-not-utf8"),
        pytest.param("AAAAAAAAAAAAAAAAAAAA", id="uppercase"),
    ],
)
def test_hostile_sandbox_ids_are_not_found(server, sandbox_id):
    """404; an id with '/' names no route of E2B's API: the catch-all's 501 that says so."""
    answer = httpx.get(
        f"{server.url}/e2b/sandboxes/{sandbox_id}", headers={"X-API-Key": KEY}, timeout=60
    )
    if "%2F" in sandbox_id:
        assert answer.status_code == 501 and "is not supported" in answer.text, answer.text
    else:
        assert answer.status_code == 404 and "not found" in answer.text, answer.text


def _raw(server, request: bytes, timeout: float = 10) -> bytes:
    """One raw request on a fresh connection; the answer's bytes until it closes or
    stops (a head is enough for these rows)."""
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=timeout) as conn:
        conn.sendall(request)
        answer = b""
        try:
            while b"\r\n\r\n" not in answer or len(answer) < 64:
                chunk = conn.recv(65536)
                if not chunk:
                    break
                answer += chunk
        except TimeoutError:
            pass
        return answer


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        pytest.param(b"X-API-Key: e2b_" + b"a" * 100_000 + b"\r\n", b"431", id="key-100KB"),
        pytest.param("X-API-Key: e2b_ａｂ\r\n".encode(), b"401", id="key-non-ascii"),
        pytest.param(b"X-API-Key: e2b_\xff\xfe\r\n", b"401", id="key-invalid-utf8"),
        pytest.param(b"Authorization: Bearer x\r\n" * 500, b"401", id="authorization-500x"),
    ],
)
def test_hostile_headers_are_a_4xx(server, headers, status):
    head = b"GET /e2b/v2/sandboxes HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n" + headers
    answer = _raw(server, head + b"\r\n")
    assert answer.split(b" ", 2)[1] == status, answer[:300]


# -- bodies: declared lengths, trickles ------------------------------------------------------


def _head(rpc: str, sandbox, framing: str) -> bytes:
    """A stream request's head (``framing``: its Content-Length or Transfer-Encoding)."""
    return (
        f"POST /e2b/envd/{rpc} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: {STREAM}\r\n"
        f"{framing}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in sandbox[1].items()) + "\r\n"
    ).encode()


def test_a_declared_length_past_the_bound_is_refused_before_the_body(server, sandbox):
    watch = PeakWatch(server.proc.pid)
    started = time.monotonic()
    answer = _raw(server, _head(START, sandbox, f"Content-Length: {2**32 - 1}"))  # no body
    assert answer.startswith(b"HTTP/1.1 413"), answer[:300]
    assert time.monotonic() - started < 5
    watch.check()


def test_a_trickled_body_is_cut_at_the_body_timeout(server, sandbox):
    """100 MB announced chunked, sent a few bytes a time: 408 at the (2 s) body timeout,
    nothing held but what came."""
    watch = PeakWatch(server.proc.pid)
    host, port = server.url.removeprefix("http://").split(":")
    head = _head(START, sandbox, "Transfer-Encoding: chunked")
    with socket.create_connection((host, int(port)), timeout=10) as conn:
        conn.sendall(head + b"5\r\n" + struct.pack(">BI", 0, 100 << 20) + b"\r\n")
        started, answer = time.monotonic(), b""
        conn.settimeout(0.2)
        while b"\r\n\r\n" not in answer and time.monotonic() - started < 8:
            try:
                conn.sendall(b"1\r\n \r\n")
                answer += conn.recv(4096)
            except TimeoutError:
                continue
            except OSError:
                break
    assert answer.startswith(b"HTTP/1.1 408"), answer[:300]
    watch.check()


# -- streams: dropped, never read ---------------------------------------------------------------


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _start(server, sandbox, command: str, timeout: float = 30) -> int:
    """A background process (its stream read up to the pid, then dropped): its pid."""
    body = frame(json.dumps({"process": {"cmd": "/bin/bash", "args": ["-c", command]}}).encode())
    with httpx.stream(
        "POST",
        f"{server.url}/e2b/envd/{START}",
        content=body,
        headers={**sandbox[1], "Content-Type": STREAM},
        timeout=timeout,
    ) as answer:
        got = b""
        for chunk in answer.iter_bytes():
            got += chunk
            end = 5 + struct.unpack(">I", got[1:5])[0] if len(got) >= 5 else len(got) + 1
            if len(got) >= end:
                first = _frames(got[:end])[0][1]
                assert "event" in first, first  # not the end-stream error (429: a slot kept)
                return first["event"]["start"]["pid"]
    raise AssertionError(f"no start event: {got[:300]!r}")


def _kill(server, sandbox, pid: int) -> None:
    httpx.post(
        f"{server.url}/e2b/envd/process.Process/SendSignal",
        json={"process": {"pid": pid}, "signal": "SIGNAL_SIGKILL"},
        headers=sandbox[1],
        timeout=30,
    )


async def _open_and_drop(
    url: tuple[str, int], head: bytes, body: bytes, first: bytes = b'"event"'
) -> None:
    """One stream: sent, read until its ``first`` message (not an error: a slot kept by
    an earlier stream would make it the 429), then the connection dropped."""
    reader, writer = await asyncio.open_connection(*url)
    try:
        writer.write(head + body)
        await writer.drain()
        got = await reader.readuntil(b"\r\n\r\n")
        while first not in got and b'"error"' not in got:
            more = await reader.read(4096)
            assert more, got
            got += more
        assert b'"error"' not in got, got[-300:]
    finally:
        writer.transport.abort()  # a reset, no goodbye


def test_dropped_start_streams_free_their_slots(server, sandbox):
    """34 ``Start``s, each dropped at its first event: past the per-user cap of 32, so a
    slot a dropped stream kept would make the last ones the 429."""
    for _ in range(34):
        _start(server, sandbox, "echo x")


def test_a_thousand_dropped_streams_are_freed(server, sandbox):
    """1,000 ``Connect`` streams following one process, 25 at once, each dropped at its
    first event: the API's fds come back to where they were, its peak RSS stays bounded,
    and each stream was admitted (none kept its slot: the cap is 32)."""
    pid = _start(server, sandbox, "echo ready; sleep 60")
    api = server.proc.pid
    try:
        watch, fds = PeakWatch(api), _fds(api)
        host, port = server.url.removeprefix("http://").split(":")
        body = frame(json.dumps({"process": {"pid": pid}}).encode())
        head = _head(CONNECT, sandbox, f"Content-Length: {len(body)}")

        async def attack() -> None:
            for _ in range(40):
                await asyncio.gather(
                    *(_open_and_drop((host, int(port)), head, body) for _ in range(25))
                )

        asyncio.run(asyncio.wait_for(attack(), 30))
        deadline = time.monotonic() + 5
        while _fds(api) > fds + 4:
            assert time.monotonic() < deadline, f"fds {fds} → {_fds(api)}"
            time.sleep(0.1)
        watch.check()
    finally:
        _kill(server, sandbox, pid)


def test_dropped_watch_streams_free_their_watchers(server, sandbox):
    """40 ``WatchDir`` streams, 4 at a time, each dropped once started: a watcher kept by
    a dropped stream would make the ninth the sandbox's "at most 8" error."""
    host, port = server.url.removeprefix("http://").split(":")
    body = frame(b'{"path": ""}')
    head = _head(WATCH, sandbox, f"Content-Length: {len(body)}")

    async def attack() -> None:
        for _ in range(10):
            await asyncio.gather(
                *(_open_and_drop((host, int(port)), head, body, b'"start"') for _ in range(4))
            )
            await asyncio.sleep(0.05)  # the dropped ones' ends run (their finally)

    asyncio.run(asyncio.wait_for(attack(), 30))


def test_a_client_that_never_reads_costs_bounded_memory(server, sandbox):
    """A process writing as fast as it can to a stream whose client reads nothing: the
    API's and the runtime's peak RSS stay bounded (backpressure, the runtime's bounded
    buffer), and the process is killed as any other."""
    runtimes = [
        int(p) for p in os.listdir("/proc") if p.isdigit() and _parent(int(p)) == server.proc.pid
    ]
    watch = PeakWatch(server.proc.pid, *runtimes)
    host, port = server.url.removeprefix("http://").split(":")
    body = frame(json.dumps({"process": {"cmd": "/bin/bash", "args": ["-c", "yes"]}}).encode())
    head = _head(START, sandbox, f"Content-Length: {len(body)}")
    conn = socket.create_connection((host, int(port)), timeout=10)
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    try:
        conn.sendall(head + body)
        time.sleep(4)  # `yes` writes ~GBs meanwhile; nobody reads
        watch.check()
    finally:
        conn.close()
        listed = _envd(server, sandbox, "process.Process/List", b"{}").json()
        for process in listed["processes"]:
            _kill(server, sandbox, process["pid"])
    assert httpx.get(server.url + "/healthz", timeout=5).status_code == 200


def _parent(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return -1


# -- what the SDK makes of the refusals ----------------------------------------------------------


def test_the_sdk_raises_its_invalid_argument_error_naming_the_fix(server, sandbox):
    """The refusals above reach E2B's own SDK as ``InvalidArgumentException`` (a Connect
    ``invalid_argument``), with our message: not "unreachable", not a server error."""
    from e2b import Sandbox
    from e2b.exceptions import InvalidArgumentException

    sbx = Sandbox.connect(
        sandbox[0], api_url=f"{server.url}/e2b", sandbox_url=f"{server.url}/e2b/envd", api_key=KEY
    )
    for call, says in [
        (lambda: sbx.files.read("a\x00b"), "NUL"),
        (lambda: sbx.files.read("n" * 5000), "File name too long"),
        (lambda: sbx.files.list("../.."), "'..'"),
        (lambda: sbx.files.write("/etc/x", "x"), "outside"),
        (lambda: sbx.files.watch_dir("/etc"), "outside"),
        (lambda: sbx.commands.run("echo hi", envs={"a b": "x"}), "variable names"),
        (lambda: sbx.commands.run("echo hi", cwd="/etc"), "outside"),
        (lambda: sbx.commands.connect(0), "'pid'"),
    ]:
        with pytest.raises(InvalidArgumentException, match=says):
            call()
