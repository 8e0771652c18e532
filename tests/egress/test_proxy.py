"""The egress proxy on loopback: what a session's policy lets through, and the attacks
it refuses (raw IPs, names resolving into forbidden ranges, a tunnel whose TLS server name
is not the host it was opened for), each with the reason the client sees."""

from __future__ import annotations

import http.client
import socket
import ssl
import time

import pytest

from sandbox_workspace.egress.policy import DEFAULT_FORBIDDEN, EgressPolicy, Rule
from sandbox_workspace.egress.proxy import TLS_ALERT_UNRECOGNIZED_NAME, EgressProxy, ProxyConfig

from .conftest import LOOPBACK, Loop, table_resolve


def tls_context(ca_file) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(ca_file))


def get_through_tunnel(proxy_port: int, host: str, port: int, ca_file) -> bytes:
    conn = http.client.HTTPSConnection(
        "127.0.0.1", proxy_port, timeout=10, context=tls_context(ca_file)
    )
    conn.set_tunnel(host, port)
    try:
        conn.request("GET", "/hello")
        return conn.getresponse().read()
    finally:
        conn.close()


def allow(egress_proxy, *rules: Rule) -> None:
    egress_proxy.policies["s1"] = EgressPolicy(rules)


def test_allowed_domain_passes_through_an_untouched_tunnel(egress_proxy, upstreams):
    allow(egress_proxy, Rule.make("allowed.test", ports=[upstreams.tls_port]))
    body = get_through_tunnel(
        egress_proxy.port, "allowed.test", upstreams.tls_port, upstreams.ca_file
    )
    assert body == b"upstream saw: GET /hello HTTP/1.1"


def test_other_domain_is_refused_with_the_reason(egress_proxy, upstreams):
    allow(egress_proxy, Rule.make("allowed.test", ports=[upstreams.tls_port]))
    seen = len(upstreams.received)
    with pytest.raises(OSError, match=r"403 Egress refused: other\.test is not in this session"):
        get_through_tunnel(egress_proxy.port, "other.test", upstreams.tls_port, upstreams.ca_file)
    assert len(upstreams.received) == seen


def test_wrong_port_and_no_policy_are_refused(egress_proxy, upstreams):
    allow(egress_proxy, Rule.make("allowed.test", ports=[1]))
    with pytest.raises(OSError, match=f"port {upstreams.tls_port} of allowed.test"):
        get_through_tunnel(egress_proxy.port, "allowed.test", upstreams.tls_port, upstreams.ca_file)
    egress_proxy.policies.clear()
    with pytest.raises(OSError, match="no egress policy"):
        get_through_tunnel(egress_proxy.port, "allowed.test", upstreams.tls_port, upstreams.ca_file)


@pytest.mark.parametrize("target", ["127.0.0.1", "[::1]", "2130706433"])
def test_raw_ip_is_refused(egress_proxy, upstreams, target):
    allow(egress_proxy, Rule.make("allowed.test", ports=[upstreams.tls_port]))
    with pytest.raises(OSError, match="403 Egress refused: raw IP address"):
        get_through_tunnel(egress_proxy.port, target, upstreams.tls_port, upstreams.ca_file)


@pytest.mark.parametrize(
    ("name", "shown"),
    [
        ("rebind.test", "169.254.169.254, inside the forbidden range 169.254.0.0/16"),
        ("mixed.test", "10.0.0.7, inside the forbidden range 10.0.0.0/8"),
        ("v6.test", "::ffff:a9fe:a9fe, inside the forbidden range 169.254.0.0/16"),
    ],
)
def test_name_resolving_into_a_forbidden_range_is_refused(egress_proxy, upstreams, name, shown):
    allow(egress_proxy, Rule.make(name, ports=[upstreams.tls_port]))
    with pytest.raises(OSError, match=f"403 Egress refused: {name} resolves to {shown}"):
        get_through_tunnel(egress_proxy.port, name, upstreams.tls_port, upstreams.ca_file)


def raw_tunnel(proxy_port: int, connect_to: str) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", proxy_port), timeout=10)
    sock.sendall(f"CONNECT {connect_to} HTTP/1.1\r\nHost: {connect_to}\r\n\r\n".encode())
    answer = b""
    while not answer.endswith(b"\r\n\r\n"):
        answer += sock.recv(1)
    assert answer.startswith(b"HTTP/1.1 200"), answer
    return sock


def test_tunnel_with_another_sni_is_closed_before_reaching_upstream(egress_proxy, upstreams):
    allow(egress_proxy, Rule.make("allowed.test", ports=[upstreams.tls_port]))
    seen = len(upstreams.received)
    sock = raw_tunnel(egress_proxy.port, f"allowed.test:{upstreams.tls_port}")
    # The certificate is valid for other.test too: only the proxy can stop this.
    with (
        pytest.raises(ssl.SSLError, match="UNRECOGNIZED_NAME"),
        tls_context(upstreams.ca_file).wrap_socket(sock, server_hostname="other.test") as tls,
    ):
        tls.sendall(b"GET /fronted HTTP/1.1\r\nHost: other.test\r\n\r\n")
        tls.recv(100)
    assert len(upstreams.received) == seen


def test_tunnel_that_is_not_tls_is_closed(egress_proxy, upstreams):
    allow(egress_proxy, Rule.make("allowed.test", ports=[upstreams.http_port]))
    seen = len(upstreams.received)
    sock = raw_tunnel(egress_proxy.port, f"allowed.test:{upstreams.http_port}")
    with sock:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: allowed.test\r\n\r\n")
        assert sock.recv(100) == TLS_ALERT_UNRECOGNIZED_NAME
        assert sock.recv(100) == b""
    assert len(upstreams.received) == seen


def plain_get(proxy_port: int, url: str, **headers: str) -> http.client.HTTPResponse:
    conn = http.client.HTTPConnection("127.0.0.1", proxy_port, timeout=10)
    conn.request("GET", url, headers=headers)
    response = conn.getresponse()
    response.body = response.read()
    conn.close()
    return response


def test_plain_http_is_forwarded_with_host_from_the_url(egress_proxy, upstreams):
    allow(egress_proxy, Rule.make("plain.test", ports=[upstreams.http_port], schemes=["http"]))
    url = f"http://plain.test:{upstreams.http_port}/simple/pkg/?q=1"
    response = plain_get(egress_proxy.port, url, Host="evil.test")
    assert (
        response.status == 200 and response.body == b"upstream saw: GET /simple/pkg/?q=1 HTTP/1.1"
    )
    head = upstreams.received[-1].lower()
    assert f"host: plain.test:{upstreams.http_port}".encode() in head
    assert b"evil.test" not in head and b"connection: close" in head


def test_plain_http_to_a_tls_only_rule_is_refused(egress_proxy, upstreams):
    allow(egress_proxy, Rule.make("plain.test", ports=[upstreams.http_port]))
    response = plain_get(egress_proxy.port, f"http://plain.test:{upstreams.http_port}/")
    assert response.status == 403
    assert response.reason.startswith("Egress refused: http to plain.test is not allowed")
    assert response.getheader("X-Sandbox-Egress") == "refused"


def test_origin_form_request_is_refused(egress_proxy):
    response = plain_get(egress_proxy.port, "/not-a-proxy-request")
    assert response.status == 400 and b"absolute form" in response.body


def test_each_unix_socket_is_its_own_session(upstreams, tmp_path, loop_thread: Loop):
    """The local backend binds one socket into each session's namespace: the socket, not
    anything the client says, decides whose policy applies."""
    policies = {
        "alice": EgressPolicy((Rule.make("allowed.test", ports=[upstreams.tls_port]),)),
        "bob": EgressPolicy(),
    }
    proxy = EgressProxy(
        policies.get,
        resolve=table_resolve,
        config=ProxyConfig(forbidden=tuple(n for n in DEFAULT_FORBIDDEN if n != LOOPBACK)),
    )
    servers = {
        who: loop_thread.run(proxy.serve_unix(str(tmp_path / f"{who}.sock"), who))
        for who in policies
    }
    connect = f"CONNECT allowed.test:{upstreams.tls_port} HTTP/1.1\r\n\r\n".encode()
    answers = {}
    for who in policies:
        with socket.socket(socket.AF_UNIX) as sock:
            sock.settimeout(10)
            sock.connect(str(tmp_path / f"{who}.sock"))
            sock.sendall(connect)
            answers[who] = sock.recv(200).split(b"\r\n")[0]
    assert answers == {
        "alice": b"HTTP/1.1 200 Connection established",
        "bob": b"HTTP/1.1 403 Egress refused: allowed.test is not in this session's egress"
        b" policy (allowed: nothing)",
    }
    for server in servers.values():
        loop_thread.close(server)


def raw_request(proxy_port: int, request: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", proxy_port), timeout=10) as sock:
        sock.sendall(request)
        answer = b""
        while chunk := sock.recv(4096):
            answer += chunk
    return answer


@pytest.mark.parametrize(
    "smuggled",
    [
        b"X-A: a\nHost: evil.test",  # a bare LF: a second header to a lenient upstream
        b"X-A: a\r\n Host: evil.test",  # an obs-fold continuation line
        b"Host : evil.test",  # whitespace before the colon
        b"Content-Length: 0\r\nContent-Length: 60",  # two lengths: a second request
        b"Content-Length: 1e3",
    ],
)
def test_heads_an_upstream_could_read_differently_are_refused(egress_proxy, upstreams, smuggled):
    allow(egress_proxy, Rule.make("plain.test", ports=[upstreams.http_port], schemes=["http"]))
    seen = len(upstreams.received)
    url = f"http://plain.test:{upstreams.http_port}/"
    answer = raw_request(
        egress_proxy.port, b"POST %s HTTP/1.1\r\n%s\r\n\r\n" % (url.encode(), smuggled)
    )
    assert answer.startswith(b"HTTP/1.1 400 Egress refused: ")
    assert len(upstreams.received) == seen


def test_a_body_is_forwarded_with_one_length(egress_proxy, upstreams):
    allow(egress_proxy, Rule.make("plain.test", ports=[upstreams.http_port], schemes=["http"]))
    url = f"http://plain.test:{upstreams.http_port}/upload"
    answer = raw_request(
        egress_proxy.port,
        b"POST %s HTTP/1.1\r\nContent-Length: 3\r\nX-Tool: t\r\n\r\nabc" % url.encode(),
    )
    assert answer.startswith(b"HTTP/1.1 200 OK")
    head = upstreams.received[-1].lower()
    assert head.count(b"content-length:") == 1 and b"content-length: 3" in head
    assert b"x-tool: t" in head


@pytest.mark.parametrize(
    "request_line",
    [
        b"GET {url} HTTP/1.1\nHost: evil.test",  # a header smuggled in the version
        b"GET\x0b {url} HTTP/1.1",
        b"GET {url}\x01 HTTP/1.1",
        b"GET {url} HTTP/2.0",
    ],
)
def test_malformed_request_lines_are_refused(egress_proxy, upstreams, request_line):
    allow(egress_proxy, Rule.make("plain.test", ports=[upstreams.http_port], schemes=["http"]))
    seen = len(upstreams.received)
    url = f"http://plain.test:{upstreams.http_port}/".encode()
    answer = raw_request(egress_proxy.port, request_line.replace(b"{url}", url) + b"\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 400 Egress refused: malformed request line")
    assert len(upstreams.received) == seen


def test_an_oversized_head_is_refused(egress_proxy):
    answer = raw_request(
        egress_proxy.port,
        b"GET http://plain.test/ HTTP/1.1\r\nX-Big: " + b"a" * 40000 + b"\r\n\r\n",
    )
    assert answer.startswith(b"HTTP/1.1 431 Egress refused: request head too large")


def test_a_client_hello_split_over_segments_is_read_whole(egress_proxy, upstreams):
    """The proxy keeps reading until the ClientHello is complete before it decides."""
    allow(egress_proxy, Rule.make("allowed.test", ports=[upstreams.tls_port]))
    sock = raw_tunnel(egress_proxy.port, f"allowed.test:{upstreams.tls_port}")
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = tls_context(upstreams.ca_file).wrap_bio(
        incoming, outgoing, server_hostname="allowed.test"
    )

    def step(action):
        """Run a TLS action, pumping records over the socket until it completes."""
        while True:
            try:
                result = action()
            except ssl.SSLWantReadError:
                if outgoing.pending:
                    sock.sendall(outgoing.read())
                data = sock.recv(65536)
                assert data, "the proxy closed the tunnel"
                incoming.write(data)
                continue
            if outgoing.pending:
                sock.sendall(outgoing.read())
            return result

    with pytest.raises(ssl.SSLWantReadError):
        tls.do_handshake()
    hello = outgoing.read()
    sock.sendall(hello[:7])  # the record header and two bytes of the handshake header
    # Give the proxy a read of the partial hello on its own (not needed for correctness:
    # coalesced segments would pass too, only without exercising the partial read).
    time.sleep(0.05)
    sock.sendall(hello[7:])
    step(tls.do_handshake)
    step(lambda: tls.write(b"GET /split HTTP/1.1\r\nHost: allowed.test\r\n\r\n"))
    body = b""
    while b"upstream saw" not in body:
        body += step(lambda: tls.read(4096))
    assert body.endswith(b"upstream saw: GET /split HTTP/1.1")
    sock.close()


def test_a_body_that_stalls_is_cut_off(egress_proxy, upstreams):
    """Slowloris on a forwarded body: a client that promises bytes and stops sending
    them must not hold the proxy task and the upstream connection forever."""
    allow(egress_proxy, Rule.make("plain.test", ports=[upstreams.http_port], schemes=["http"]))
    url = f"http://plain.test:{upstreams.http_port}/upload"
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", egress_proxy.port), timeout=30) as sock:
        sock.sendall(b"POST %s HTTP/1.1\r\nContent-Length: 1000\r\n\r\na" % url.encode())
        while sock.recv(4096):  # read until the proxy closes
            pass
    # client_timeout is 5 s in this fixture; without a bound the recv timed out at 30 s.
    assert time.monotonic() - started < 15
