"""E2B's host routing (issue 39 item 2): the SDK configured only by ``E2B_DOMAIN``.

A dev server with ``SANDBOX_WORKSPACE_E2B_DOMAIN=sbw.test``; the official Python SDK in
a process of its own with ``E2B_DOMAIN=sbw.test`` and no ``E2B_API_URL`` or
``E2B_SANDBOX_URL``, so it calls ``https://api.sbw.test`` and
``https://{port}-{id}.sbw.test``. Those names reach the server through
``tests/support/wildcard_ingress.py`` (the SDK's HTTPS proxy: TLS with a wildcard
certificate the SDK trusts by ``SSL_CERT_FILE``, Host passed unchanged — what the
chart's Ingress does). Hostile Host headers are sent straight to the server.
"""

from __future__ import annotations

import os
import sys

import httpx
import pytest
from e2b_program import UNSUPPORTED_CALLS, run_program
from wildcard_ingress import WildcardIngress

DOMAIN = "sbw.test"
KEY = "e2b_00112233445566778899aabbccddeeff"
OTHER_KEY = "e2b_ffeeddccbbaa99887766554433221100"
pytestmark = pytest.mark.local_backend

PROGRAM = (
    r"""
import json
from e2b_code_interpreter import Sandbox

report = {}
sbx = Sandbox.create()
report["id"] = sbx.sandbox_id
sbx.files.write("/home/user/hello.txt", "hello by host")
report["read"] = sbx.files.read("hello.txt")
report["listed"] = [e.name for e in sbx.files.list("/home/user")]
streamed = []
cmd = sbx.commands.run("echo one; sleep 0.2; echo two", on_stdout=streamed.append)
report["cmd"] = [cmd.exit_code, cmd.stdout, streamed]
sbx.run_code("x = 20")
report["code"] = sbx.run_code("x + 22").text
report["listed_ids"] = [s.sandbox_id for s in Sandbox.list().next_items()]
"""
    + UNSUPPORTED_CALLS
    + r"""
report["killed"] = sbx.kill()
print(json.dumps(report))
"""
)


@pytest.fixture(scope="module")
def domain_server(start_server):
    return start_server(
        "dev",
        "--data-dir",
        "data",
        SANDBOX_WORKSPACE_SANDBOX_MOUNT="none",
        SANDBOX_WORKSPACE_E2B_DOMAIN=DOMAIN,
    )


def test_the_sdk_reaches_api_and_sandbox_by_name_only(domain_server, tmp_path):
    port = int(domain_server.url.rsplit(":", 1)[1])
    with WildcardIngress(DOMAIN, port, tmp_path) as ingress:
        report = run_program(
            [sys.executable, "-c", PROGRAM],
            {
                "PATH": os.environ["PATH"],
                "HOME": str(tmp_path),
                "E2B_DOMAIN": DOMAIN,
                "E2B_API_KEY": KEY,
                "HTTPS_PROXY": ingress.proxy,
                "SSL_CERT_FILE": str(ingress.ca_file),
            },
            tmp_path,
        )
        sid = report["id"]
        # Every request went by name: the API's, envd's and the code interpreter's.
        assert {f"api.{DOMAIN}", f"49983-{sid}.{DOMAIN}", f"49999-{sid}.{DOMAIN}"} <= set(
            ingress.connects
        ), ingress.connects
    assert report["read"] == "hello by host" and "hello.txt" in report["listed"]
    assert report["cmd"][:2] == [0, "one\ntwo\n"] and report["cmd"][2][0] == "one\n"
    assert report["code"] == "42"
    assert sid in report["listed_ids"] and report["killed"] is True
    for call, answer in report["unsupported"].items():  # docs/e2b.md's table, by name
        assert "not supported" in answer, (call, answer)


def _sandbox(client: httpx.Client, key: str) -> dict:
    made = client.post("/e2b/v2/sandboxes", json={}, headers={"X-API-KEY": key})
    assert made.status_code == 201, made.text
    return made.json()


def test_hostile_host_headers_get_clear_errors(domain_server):
    with httpx.Client(base_url=domain_server.url, timeout=60) as client:
        mine, theirs = _sandbox(client, KEY), _sandbox(client, OTHER_KEY)
        token = {"X-Access-Token": mine["envdAccessToken"]}

        def get(host: str, **headers: str) -> httpx.Response:
            return client.get("/files?path=hello.txt", headers={"Host": host, **headers})

        try:
            client.post("/e2b/envd/files?path=hello.txt", content=b"mine", headers={
                **token, "E2b-Sandbox-Id": mine["sandboxID"],
                "Content-Type": "application/octet-stream",
            })  # fmt: skip
            own = get(f"49983-{mine['sandboxID']}.{DOMAIN}:443", **token)
            assert own.status_code == 200 and own.content == b"mine"
            # Another tenant's sandbox by name, with my token: its token is the key.
            other = get(f"49983-{theirs['sandboxID']}.{DOMAIN}", **token)
            assert other.status_code == 401 and "another sandbox" in other.json()["message"]
            # The SDK's header naming another sandbox than the Host: refused, not overridden.
            mixed = get(f"49983-{theirs['sandboxID']}.{DOMAIN}", **token, **{
                "E2b-Sandbox-Id": mine["sandboxID"]})  # fmt: skip
            assert mixed.status_code == 400 and "another sandbox" in mixed.json()["message"]
            port = get(f"8080-{mine['sandboxID']}.{DOMAIN}", **token)
            assert port.status_code == 501 and "49983" in port.json()["message"]
            for bad in (
                f"{mine['sandboxID']}.{DOMAIN}",  # no port
                f"x.49983-{mine['sandboxID']}.{DOMAIN}",  # two labels
                f"49983-{'a' * 70}.{DOMAIN}",  # a label over 63
                f"49983-../etc.{DOMAIN}",
                f"49983-{mine['sandboxID']}_x.{DOMAIN}",
            ):
                answer = get(bad, **token)
                assert answer.status_code == 400, (bad, answer.text)
                assert "{port}-{sandboxID}" in answer.json()["message"]
            long = get("a" * 5000 + f".{DOMAIN}", **token)
            assert long.status_code == 400 and "over 253" in long.json()["message"]
            unknown = get(f"49983-{'0' * 19}g.{DOMAIN}", **token)
            assert unknown.status_code == 404
            # api.{domain} is E2B's API; a foreign name is refused by dev mode's Host check.
            listed = client.get(
                "/v2/sandboxes", headers={"Host": f"api.{DOMAIN}", "X-API-KEY": KEY}
            )
            assert [s["sandboxID"] for s in listed.json()] == [mine["sandboxID"]]
            assert client.get("/healthz", headers={"Host": "evil.example"}).status_code == 400
            assert client.get("/healthz", headers={"Host": f"evil{DOMAIN}"}).status_code == 400
        finally:
            for sandbox, key in ((mine, KEY), (theirs, OTHER_KEY)):
                client.delete(f"/e2b/sandboxes/{sandbox['sandboxID']}", headers={"X-API-KEY": key})
