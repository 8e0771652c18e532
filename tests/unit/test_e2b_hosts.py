"""``api/e2b/hosts.py``'s pure decision and the domain setting's rule (issue 39 item 2)."""

from __future__ import annotations

import asyncio

import pytest

from sandbox_workspace.api.e2b.domain import check_domain
from sandbox_workspace.api.e2b.hosts import (
    HostError,
    HostRouting,
    PortNotSupported,
    Route,
    route,
)
from sandbox_workspace.api.e2b.ids import SandboxNotFound
from sandbox_workspace.api.settings import ApiSettings

SID = "0123456789abcdef0123"


def test_names_under_the_domain_pick_the_routes():
    assert route("api.sbw.example", "sbw.example") == Route("/e2b")
    assert route(f"49983-{SID}.SBW.example.:443", "sbw.example") == Route("/e2b/envd", SID, 49983)
    assert route(f"49999-{SID}-client.sbw.example", "sbw.example") == Route("/e2b/envd", SID, 49999)
    for other in ("sbw.example", "127.0.0.1:8000", "api.sbw.example.evil", "xsbw.example", ""):
        assert route(other, "sbw.example") is None


@pytest.mark.parametrize(
    ("host", "error"),
    [
        (f"3000-{SID}.sbw.example", PortNotSupported),
        (f"{SID}.sbw.example", HostError),
        (f"a.49983-{SID}.sbw.example", HostError),
        ("49983-" + "a" * 60 + ".sbw.example", HostError),
        ("x" * 300, HostError),
        ("49983-zz.sbw.example", SandboxNotFound),
    ],
)
def test_hostile_names_are_refused(host, error):
    with pytest.raises(error):
        route(host, "sbw.example")


def test_the_domain_setting_must_be_a_dns_name():
    assert check_domain(" Sandboxes.Example.com. ") == "sandboxes.example.com"
    for bad in ("localhost", "*.example.com", "a..b", "-a.com", "a.com/x", "x" * 300 + ".com"):
        with pytest.raises(ValueError):
            check_domain(bad)
    assert ApiSettings(auth_mode="dev", e2b_domain="E.example").e2b_domain == "e.example"
    with pytest.raises(ValueError, match="SANDBOX_WORKSPACE_E2B_DOMAIN"):
        ApiSettings(auth_mode="dev", e2b_domain="not a name")


def test_two_host_headers_are_refused_and_one_is_rewritten():
    seen, sent = [], []

    async def app(scope, receive, send):
        seen.append(scope)

    async def send(message):
        sent.append(message)

    def call(*hosts: bytes) -> None:
        headers = [(b"host", h) for h in hosts] + [(b"e2b-sandbox-port", b"1")]
        scope = {"type": "http", "path": "/files", "raw_path": b"/files", "headers": headers}
        asyncio.run(HostRouting(app, "sbw.example")(scope, None, send))

    call(f"49983-{SID}.sbw.example".encode(), b"127.0.0.1")
    assert not seen and sent[0]["status"] == 400
    call(f"49999-{SID}.sbw.example".encode())
    (scope,) = seen
    assert (scope["path"], scope["raw_path"]) == ("/e2b/envd/files", b"/e2b/envd/files")
    assert (b"e2b-sandbox-id", SID.encode()) in scope["headers"]
    assert [v for k, v in scope["headers"] if k == b"e2b-sandbox-port"] == [b"49999"]
