"""Egress on the local backend (issue 40 item 2): each session's code runs in a network
namespace of its own whose one way out is the egress proxy of the ``dev`` process, by a
Unix socket bound into that session alone.

One real ``sandbox-workspace dev`` under bubblewrap for the module; two package indexes
served by the test on 127.0.0.1, reached by names only the test's table resolves
(``index.test``, ``other.test``); loopback taken off the forbidden ranges for them.
"""

from __future__ import annotations

import json
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from wheel_index import make_wheel, serve_index

from sandbox_workspace.runtime import landlock

pytestmark = pytest.mark.skipif(
    shutil.which("bwrap") is None or landlock.abi_version() < 4,
    reason="needs bubblewrap and Landlock ABI >= 4 (TCP rules)",
)

REFUSED = "Egress refused"


@pytest.fixture(scope="module")
def indexes(tmp_path_factory) -> Iterator[dict[str, int]]:
    root = tmp_path_factory.mktemp("indexes")
    servers = {}
    for name, version in (("allowed", "1.0"), ("other", "6.6.6")):
        make_wheel(root / name, "egress-probe", version)
        servers[name] = serve_index(root / name)
    yield {name: s.server_address[1] for name, s in servers.items()}
    for s in servers.values():
        s.shutdown()
        s.server_close()


@pytest.fixture(scope="module")
def server(start_server, indexes, tmp_path_factory):
    # TMPDIR: the run directory of the proxy's and runtimes' sockets, for the test to find.
    run = tmp_path_factory.mktemp("egress-run")
    srv = start_server(
        "dev",
        "--data-dir",
        "data",
        SANDBOX_WORKSPACE_SANDBOX_MOUNT="bwrap",
        SANDBOX_WORKSPACE_LOCAL_EGRESS_HOSTS=json.dumps(
            {"index.test": ["127.0.0.1"], "other.test": ["127.0.0.1"]}
        ),
        SANDBOX_WORKSPACE_LOCAL_EGRESS_PERMIT='["127.0.0.0/8"]',
        TMPDIR=str(run),
    )
    srv.run_dir = run
    return srv


class Session:
    def __init__(self, server, user: str) -> None:
        self.api = httpx.Client(base_url=server.url, headers={"X-User-Id": user}, timeout=120)
        self.url = f"/api/v1/sessions/sb-session-{user}"
        r = self.api.post("/api/v1/sessions", json={})
        assert r.status_code == 201, r.text

    def policy(self, rules: list[dict] | None) -> httpx.Response:
        return self.api.put(f"{self.url}/egress", json={"rules": rules})

    def run(self, code: str, language: str = "python") -> dict:
        r = self.api.post(
            f"{self.url}/execute",
            json={"conversation_id": "c1", "language": language, "code": code, "timeout": 90},
        )
        assert r.status_code == 200, r.text
        return r.json()

    def close(self) -> None:
        self.api.delete(self.url)
        self.api.close()


@pytest.fixture
def session(server) -> Iterator[Session]:
    s = Session(server, f"eg-{uuid.uuid4().hex[:8]}")
    yield s
    s.close()


def fetch(url: str) -> str:
    """Code that GETs ``url`` through the environment's proxy; prints status or error."""
    return f"""
import urllib.request, urllib.error
try:
    with urllib.request.urlopen({url!r}, timeout=20) as r:
        print("STATUS", r.status)
except urllib.error.HTTPError as e:
    print("STATUS", e.code, e.reason)
except OSError as e:
    print("ERROR", e)
"""


PIP = (
    "python -m pip install --no-cache-dir --disable-pip-version-check --retries 0 "
    "--timeout 20 -vv --target /workspace/c1/{target} --trusted-host {host} "
    "--index-url http://{host}:{port}/simple/ egress-probe 2>&1 | "
    "grep -E 'Successfully installed|Could not fetch URL|ERROR' | cut -c1-300"
)


def test_pip_installs_from_the_allowed_index_and_not_from_another(session, indexes):
    # Two real pip runs (about 2 s each on an idle machine, pip's own start-up mostly):
    # the "done when" is pip itself, so no cheaper client stands in for it.
    allowed, other = indexes["allowed"], indexes["other"]
    r = session.policy([{"host": "index.test", "ports": [allowed], "schemes": ["http"]}])
    assert r.status_code == 200, r.text
    assert session.api.get(f"{session.url}/egress").json() == {
        "rules": [{"host": "index.test", "ports": [allowed], "schemes": ["http"]}]
    }
    ok = session.run(PIP.format(target="t1", host="index.test", port=allowed), "bash")
    assert "Successfully installed egress-probe-1.0" in ok["stdout"], ok
    refused = session.run(PIP.format(target="t2", host="other.test", port=other), "bash")
    assert "Successfully installed" not in refused["stdout"], refused
    assert f"{REFUSED}: other.test is not in this session's egress policy" in refused["stdout"], (
        refused
    )
    # The installed module is the allowed index's, importable by the session's code.
    origin = session.run(
        "import sys\nsys.path.insert(0, '/workspace/c1/t1')\n"
        "import egress_probe\nprint(egress_probe.ORIGIN)"
    )
    assert origin["stdout"].strip().endswith("allowed"), origin


def test_no_policy_no_network_and_a_live_change_applies_to_the_next_connection(session, indexes):
    url = f"http://index.test:{indexes['allowed']}/simple/"
    assert session.api.get(f"{session.url}/egress").json() == {"rules": None}
    out = session.run(fetch(url))["stdout"]
    assert "STATUS 403" in out and "no egress policy" in out, out
    rule = {"host": "index.test", "ports": [indexes["allowed"]], "schemes": ["http"]}
    assert session.policy([rule]).status_code == 200
    assert "STATUS 200" in session.run(fetch(url))["stdout"]
    assert session.policy(None).status_code == 200
    out = session.run(fetch(url))["stdout"]
    assert "STATUS 403" in out, out


def test_raw_ips_and_the_hosts_network_are_out_of_reach(session, indexes):
    port = indexes["allowed"]
    rule = {"host": "index.test", "ports": [port], "schemes": ["http"]}
    assert session.policy([rule]).status_code == 200
    out = session.run(fetch(f"http://127.0.0.1:{port}/simple/"))["stdout"]
    assert "STATUS 403" in out and "IP address" in out, out
    # Not through the proxy: the namespace has no route to the host's loopback, and
    # Landlock allows TCP connect to the relay's port alone; no UDP, no IPv6.
    direct = session.run(f"""
import socket
for family, kind, address in (
    (socket.AF_INET, socket.SOCK_STREAM, ("127.0.0.1", {port})),
    (socket.AF_INET, socket.SOCK_DGRAM, ("127.0.0.1", 53)),
    (socket.AF_INET6, socket.SOCK_STREAM, ("::1", {port})),
):
    try:
        s = socket.socket(family, kind)
        s.settimeout(3)
        s.connect(address)
        print("CONNECTED", address)
    except OSError as e:
        print("REFUSED", e.errno)
""")["stdout"]
    assert "CONNECTED" not in direct and direct.count("REFUSED") == 3, direct
    interfaces = session.run("print(open('/proc/net/dev').read())")["stdout"]
    names = [line.split(":")[0].strip() for line in interfaces.splitlines()[2:] if ":" in line]
    assert names == ["lo"], interfaces


def test_a_session_cannot_reach_another_sessions_proxy_socket(server, session, indexes):
    """A's policy allows the index; B has none. B's traffic is judged by B's socket, and
    A's sockets (on the host, in the API's run directory) are not in B's sandbox."""
    url = f"http://index.test:{indexes['allowed']}/simple/"
    rule = {"host": "index.test", "ports": [indexes["allowed"]], "schemes": ["http"]}
    assert session.policy([rule]).status_code == 200
    assert "STATUS 200" in session.run(fetch(url))["stdout"]
    other = Session(server, f"eg-b-{uuid.uuid4().hex[:8]}")
    try:
        out = other.run(fetch(url))["stdout"]
        assert "STATUS 403" in out and "no egress policy" in out, out
        sockets = sorted(str(p) for p in Path(server.run_dir).glob("sbw-net-*/*/*/*.sock"))
        assert len(sockets) == 4, sockets  # two sessions: a runtime's and the proxy's each
        probe = other.run(f"""
import os, socket
for path in {sockets!r}:
    try:
        s = socket.socket(socket.AF_UNIX)
        s.connect(path)
        print("CONNECTED", path)
    except OSError as e:
        print("REFUSED", e.errno, os.path.exists(path))
""")["stdout"]
        assert "CONNECTED" not in probe and probe.count("REFUSED") == 4, probe
    finally:
        other.close()


def test_policies_are_validated_bounded_and_the_callers_own(server, session):
    bad = session.policy([{"host": "127.0.0.1", "ports": [80], "schemes": ["http"]}])
    assert bad.status_code == 422 and "rules.0.host" in bad.json()["error"]["message"], bad.text
    wild = session.policy([{"host": "a.*.test"}])
    assert wild.status_code == 422, wild.text
    many = session.policy([{"host": f"h{i}.test"} for i in range(101)])
    assert many.status_code in (400, 422), many.text
    assert session.api.get(f"{session.url}/egress").json() == {"rules": None}
    # Another user reaches no one's policy but their own.
    stranger = {"X-User-Id": f"eg-x-{uuid.uuid4().hex[:8]}"}
    for method in ("GET", "PUT"):
        r = httpx.request(
            method, f"{server.url}{session.url}/egress", headers=stranger, json={"rules": []}
        )
        assert r.status_code == 404, r.text
    assert session.api.get(f"{session.url}/egress").json() == {"rules": None}


def test_without_namespaces_a_policy_is_refused_not_pretended(api, session_url):
    """The shared dev server runs without bubblewrap: nothing would enforce a policy."""
    assert api.post("/api/v1/sessions", json={}).status_code == 201
    for method in ("GET", "PUT"):
        r = api.request(method, f"{session_url}/egress", json={"rules": None})
        assert r.status_code == 409 and r.json()["error"]["code"] == "egress_unavailable", r.text
