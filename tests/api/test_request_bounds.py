"""Attacks on the API's memory and connections, against a real API process whose peak
RSS and /healthz are watched: oversized bodies (declared or chunked) are refused before
they are read and before authentication, headers are bounded in size and time, a body
that trickles is cut; uploads still stream past the body limit."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import httpx
import pytest
from api_calls import required_api
from rss_watch import PeakWatch

pytestmark = pytest.mark.local_backend

LIMIT = 1024 * 1024
SERVICE_TOKEN = "bounds-service-token-0123456789"
BOUNDS = {
    "SANDBOX_WORKSPACE_BOUNDS__MAX_BODY_BYTES": str(LIMIT),
    "SANDBOX_WORKSPACE_BOUNDS__BODY_TIMEOUT_SECONDS": "2",
    "SANDBOX_WORKSPACE_BOUNDS__MAX_HEADER_BYTES": "16384",
    "SANDBOX_WORKSPACE_BOUNDS__HEADER_TIMEOUT_SECONDS": "2",
    "SANDBOX_WORKSPACE_QUOTAS__UPLOADS_PER_USER": "2",
}


class Watched:
    """The API process: its peak RSS growth since the start of the attack, its health."""

    def __init__(self, server) -> None:
        self.server = server
        self.peak = PeakWatch(server.proc.pid)

    def assert_unharmed(self) -> None:
        self.peak.check()
        assert httpx.get(self.server.url + "/healthz", timeout=5).status_code == 200


@pytest.fixture(scope="module")
def bounded_api(start_server):
    return required_api(start_server, SERVICE_TOKEN, **BOUNDS)


def connect(server) -> socket.socket:
    host, port = server.url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=10)
    return sock


def read_answer(sock: socket.socket, deadline: float = 10.0) -> bytes:
    """Everything the server sends until it closes (or ``deadline`` seconds pass)."""
    sock.settimeout(deadline)
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except (ConnectionResetError, TimeoutError):
        pass
    return data


def flood(server, head: bytes, chunk: bytes, total: int) -> bytes:
    """Send ``head`` then ``chunk`` until ``total`` bytes or the server stops reading,
    while reading what the server answers; that answer."""
    sock = connect(server)

    def send() -> None:
        try:
            sock.sendall(head)
            sent = 0
            while sent < total:
                sock.sendall(chunk)
                sent += len(chunk)
        except OSError:
            pass  # the server refused and closed: what the test expects

    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    answer = read_answer(sock)
    sock.close()
    thread.join(30)
    return answer


def test_a_trailer_that_never_ends_is_cut(bounded_api):
    """A chunked body's trailer fields are headers too, and httptools holds them the same
    way until complete: one that never ends is cut at the header bound, not held until
    the body timeout."""
    watched = Watched(bounded_api)
    head = (
        b"POST /api/v1/chat HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\nX-Trailer: "
    )
    started = time.monotonic()
    answer = flood(bounded_api, head, b"a" * 65536, 256 << 20)
    assert time.monotonic() - started < 1.5, answer[:200]  # not at the body timeout (2 s)
    watched.assert_unharmed()


def test_a_declared_oversized_body_is_refused_before_it_is_read(bounded_api):
    """3 GiB declared, no credentials: 413 arrives while the body is still being sent."""
    watched = Watched(bounded_api)
    for _ in range(4):
        head = (
            b"POST /api/v1/chat HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % (3 << 30)
        )
        answer = flood(bounded_api, head, b"0" * 65536, 256 << 20)
        assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
        assert b"body_too_large" in answer and b"MAX_BODY_BYTES" in answer
    watched.assert_unharmed()


def test_a_chunked_body_past_the_limit_is_cut_at_the_limit(bounded_api):
    """No length given: the body is counted as it arrives and refused one byte past the
    limit, before any route or authentication runs."""
    watched = Watched(bounded_api)
    head = (
        b"POST /api/v1/chat HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n"
    )
    block = b"0" * 65536
    answer = flood(bounded_api, head, b"%x\r\n%b\r\n" % (len(block), block), 512 << 20)
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    watched.assert_unharmed()


def test_a_body_within_the_limit_reaches_authentication(bounded_api):
    r = httpx.post(bounded_api.url + "/api/v1/chat", content=b"{}" + b" " * (LIMIT - 2))
    assert r.status_code == 401  # read, then refused for want of credentials
    chunked = httpx.post(bounded_api.url + "/api/v1/chat", content=iter([b"{", b"}"]))
    assert chunked.status_code == 401


@pytest.mark.parametrize(
    "framing",
    [
        b"Transfer-Encoding: chunked\r\n\r\n1\r\n{\r\n",
        # A length within the limit and fewer bytes sent: the route waited for the rest
        # for ever, holding what came.
        b"Content-Length: 1000\r\n\r\n{",
    ],
    ids=["chunked", "short-of-its-length"],
)
def test_a_trickling_body_is_cut_after_the_body_timeout(bounded_api, framing):
    sock = connect(bounded_api)
    sock.sendall(b"POST /api/v1/chat HTTP/1.1\r\nHost: x\r\n" + framing)
    started = time.monotonic()
    answer = read_answer(sock, deadline=8)
    sock.close()
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    assert time.monotonic() - started < 8


def test_headers_past_the_limit_answer_431(bounded_api):
    watched = Watched(bounded_api)
    pad = b"X-Pad: " + b"a" * 1000 + b"\r\n"
    answer = flood(bounded_api, b"GET /healthz HTTP/1.1\r\nHost: x\r\n", pad, 64 << 20)
    assert answer.startswith(b"HTTP/1.1 431"), answer[:200]
    watched.assert_unharmed()


def test_a_header_that_never_ends_answers_431(bounded_api):
    """One header name or value sent without end: httptools hands a header over only once
    it is complete, holding (and re-copying) it until then — so the bytes are counted as
    they arrive, and one past the limit answers 431 while the header is still coming."""
    watched = Watched(bounded_api)
    for head in (b"X-Pad: ", b"X-"):
        started = time.monotonic()
        answer = flood(bounded_api, b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + head,
                       b"a" * 65536, 64 << 20)  # fmt: skip
        assert answer.startswith(b"HTTP/1.1 431"), answer[:200]
        assert time.monotonic() - started < 1.5  # at once, not at the header timeout (2 s)
    watched.assert_unharmed()


UNREAD_UPLOAD = (
    b"POST /api/v1/sessions/sb-session-x/files/upload HTTP/1.1\r\nHost: x\r\n"
    b"Content-Type: multipart/form-data; boundary=b\r\nContent-Length: 100000\r\n\r\n--b"
)


def answer_head(sock: socket.socket) -> bytes:
    """The status line and headers of the server's answer, read with a deadline."""
    sock.settimeout(5)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, data
        data += chunk
    return data.split(b"\r\n\r\n")[0].lower()


def test_an_answer_before_its_body_ends_the_connection(bounded_api):
    """An upload refused before its body is read (no credentials): the answer says
    Connection: close (a client must not send another request into it), and the server
    ends its side after it. Kept alive, each byte of the unread body cancelled uvicorn's
    keep-alive timer, which only a next answer arms again: one byte held it for ever."""
    sock = connect(bounded_api)
    sock.sendall(UNREAD_UPLOAD)
    head = answer_head(sock)
    assert head.startswith(b"http/1.1 401"), head
    assert b"\r\nconnection: close" in head, head
    started = time.monotonic()
    read_answer(sock, deadline=4)  # the answer's body, then the server's end of file
    sock.close()
    assert time.monotonic() - started < 1, "the connection was kept alive"


def test_a_body_that_trickles_after_its_answer_is_cut_at_the_body_timeout(bounded_api):
    """After the early answer what the client still sends is read and dropped (closed at
    once with bytes unread, the kernel resets the connection and can take the answer
    with it), but only for the body timeout (2 s here): 20 clients that keep trickling
    are all cut by then, and the API answers meanwhile."""
    socks = [connect(bounded_api) for _ in range(20)]
    for sock in socks:
        sock.sendall(UNREAD_UPLOAD)
        assert answer_head(sock).startswith(b"http/1.1 401")
    started = time.monotonic()
    cut: dict[int, float] = {}
    while len(cut) < len(socks) and time.monotonic() - started < 8:
        for i, sock in enumerate(socks):
            if i in cut:
                continue
            try:
                sock.sendall(b"x")  # one more byte of the body nobody reads
            except OSError:  # reset: the server's side is closed
                cut[i] = time.monotonic() - started
        assert httpx.get(bounded_api.url + "/healthz", timeout=5).status_code == 200
        time.sleep(0.1)
    for sock in socks:
        sock.close()
    assert len(cut) == len(socks), f"{len(socks) - len(cut)} connections still held"
    assert max(cut.values()) < 2 + 1.5, cut  # the body timeout, and the pace of the loop


def test_a_body_flooded_after_its_answer_is_cut_at_the_drain_bound(bounded_api):
    """What is dropped after an early answer is bounded in bytes too (16 MiB): a client
    that sends as fast as it can is reset long before the drain time, not read for it."""
    sock = connect(bounded_api)
    sock.sendall(UNREAD_UPLOAD.replace(b"100000", b"%d" % (1 << 30)))
    assert answer_head(sock).startswith(b"http/1.1 401")
    started, sent = time.monotonic(), 0
    with pytest.raises(OSError):  # reset: the server's side is closed
        while sent < 256 << 20:
            sock.sendall(b"x" * 65536)
            sent += 65536
    sock.close()
    assert sent < 64 << 20 and time.monotonic() - started < 1.5, (sent, started)


def test_a_client_reuses_its_pool_after_early_answers(bounded_api):
    """The regression of session 17's first lingering close (its answer lacked
    Connection: close, so httpx sent its next request into the half-closed connection:
    'Server disconnected without sending a response'): early answers — a 413 before the
    body is read, a 401 on an upload — each followed by a plain request on the same
    client, 50 times."""
    big = b"{}" + b" " * (2 * LIMIT)
    upload = {"file": ("f.txt", b"x" * 200_000)}
    with httpx.Client(base_url=bounded_api.url, timeout=10) as api:
        for _ in range(50):
            assert api.post("/api/v1/chat", content=big).status_code == 413
            assert api.get("/healthz").status_code == 200
            r = api.post("/api/v1/sessions/sb-session-x/files/upload", files=upload)
            assert r.status_code == 401
            assert api.get("/healthz").status_code == 200


def test_slow_headers_are_cut_and_the_api_keeps_answering(bounded_api):
    """Slowloris: many connections trickling header bytes are closed after the header
    timeout; meanwhile and after, /healthz answers."""
    socks = [connect(bounded_api) for _ in range(50)]
    for sock in socks:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
    started = time.monotonic()
    closed = set()
    while len(closed) < len(socks) and time.monotonic() - started < 15:
        assert httpx.get(bounded_api.url + "/healthz", timeout=5).status_code == 200
        for i, sock in enumerate(socks):
            if i in closed:
                continue
            try:
                sock.sendall(b"X")  # one more byte of a header that never ends
                sock.settimeout(0.01)
                if sock.recv(1) == b"":
                    closed.add(i)
            except TimeoutError:
                pass
            except OSError:
                closed.add(i)
        time.sleep(0.2)
    for sock in socks:
        sock.close()
    assert len(closed) == len(socks), f"{len(socks) - len(closed)} connections still open"
    assert time.monotonic() - started < 10


def test_uploads_stream_past_the_body_limit(bounded_api):
    """The upload routes are not bounded by max_body_bytes: their own per-session limit
    holds, and the body streams (tests/api/test_streaming_memory.py)."""
    headers = {"Authorization": f"Bearer {SERVICE_TOKEN}", "X-User-Id": "big"}
    with httpx.Client(base_url=bounded_api.url, headers=headers, timeout=60) as api:
        assert api.post("/api/v1/sessions", json={}).status_code == 201
        r = api.post(
            "/api/v1/sessions/sb-session-big/files/upload",
            data={"conversation_id": "c"},
            files={"file": ("big.csv", b"x" * (3 * LIMIT))},
        )
        assert r.status_code == 201, r.text
        assert r.json()["size"] == 3 * LIMIT
        api.delete("/api/v1/sessions/sb-session-big")


def test_pipelined_requests_with_bodies_are_all_answered(bounded_api):
    """The guards above keep HTTP/1.1 whole: requests sent back to back, bodies and all,
    in one write, are each answered on the one connection."""
    sock = connect(bounded_api)
    post = (
        b"POST /api/v1/chat HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: 2\r\n\r\n{}"
    )
    sock.sendall(post + post + b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    answer = read_answer(sock, deadline=8)
    sock.close()
    assert answer.count(b"HTTP/1.1 401") == 2 and answer.count(b"HTTP/1.1 200") == 1, answer


@pytest.mark.parametrize("framing", [b"content-length", b"transfer-encoding"])
def test_a_body_cut_by_the_client_going_away_reaches_no_route(framing):
    """Half a body, then the client is gone: the route never runs (it would take the half
    for the whole: a write of half a file, a message cut short)."""
    from sandbox_workspace.api.request_bounds import RequestBodyLimit, RequestBounds

    ran, sent = [], []
    value = b"1000" if framing == b"content-length" else b"chunked"
    scope = {"type": "http", "method": "POST", "path": "/x", "headers": [(framing, value)]}
    messages = iter([
        {"type": "http.request", "body": b'{"content": "half', "more_body": True},
        {"type": "http.disconnect"},
    ])  # fmt: skip

    async def app(scope, receive, send) -> None:
        ran.append(await receive())

    async def receive():
        return next(messages)

    async def send(message) -> None:
        sent.append(message)

    limit = RequestBodyLimit(app, RequestBounds(), streaming=[])
    asyncio.run(limit(scope, receive, send))
    assert ran == [] and sent == []


def test_uploads_that_trickle_hold_no_more_than_the_users_cap(bounded_api):
    """An upload has no body timeout, and holds a runtime connection while its body comes
    at the client's pace: one user's uploads in progress are capped (429 naming the
    setting), within a quarter of the replica's pool of their own, so trickling uploads
    cannot take the pool every other call needs. The slots come back as uploads end."""
    headers = {"Authorization": f"Bearer {SERVICE_TOKEN}", "X-User-Id": "slow"}
    with httpx.Client(base_url=bounded_api.url, headers=headers, timeout=30) as api:
        assert api.post("/api/v1/sessions", json={}).status_code == 201
        path = "/api/v1/sessions/sb-session-slow/files/upload?conversation_id=c"
        head = (
            f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {SERVICE_TOKEN}\r\n"
            "X-User-Id: slow\r\nContent-Type: multipart/form-data; boundary=b\r\n"
            "Content-Length: 100000\r\n\r\n--b\r\nContent-Disposition: form-data; "
            'name="file"; filename="slow.txt"\r\n\r\nsome bytes, the rest never'
        ).encode()

        def trickling() -> socket.socket:
            sock = connect(bounded_api)
            sock.sendall(head)
            return sock

        def answered(sock: socket.socket) -> bool:
            sock.setblocking(False)
            try:
                sock.recv(1, socket.MSG_PEEK)  # an answer, or the end (b"")
                return True
            except BlockingIOError:
                return False
            finally:
                sock.setblocking(True)

        def one_more() -> httpx.Response:
            return api.post(path, files={"file": ("quick.txt", b"x")})

        held = [trickling(), trickling()]
        deadline = time.monotonic() + 15
        while (r := one_more()).status_code == 201:
            assert time.monotonic() < deadline, "the trickling uploads never took their slots"
            # One that met this probe in progress was refused: another takes its place.
            for sock in [s for s in held if answered(s)]:
                held.remove(sock)
                sock.close()
                held.append(trickling())
            time.sleep(0.05)
        assert r.status_code == 429, r.text
        assert r.json()["error"]["code"] == "too_many_requests"
        assert "UPLOADS_PER_USER" in r.text
        for sock in held:
            sock.close()
        while (r := one_more()).status_code == 429 and time.monotonic() < deadline + 10:
            time.sleep(0.05)
        assert r.status_code == 201, r.text
        api.delete("/api/v1/sessions/sb-session-slow")
