"""The claimed pool pod's answer to ``POST /v1/claim`` (operator/pool/claim.py
``deliver_token``): only a 200 whose JSON object names the network asked for is a
delivery; any other answer — an error status, no JSON, JSON that is not an object, no
network — is a refusal with a log line saying what came back, never an exception (the
claim then deletes that pod and tries the next, or starts the session cold).
The runtime is answered on MockTransport: the shapes a real one never sends."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import httpx
import pytest

from sandbox_workspace.operator.pool.claim import deliver_token

POD = {"metadata": {"name": "pool-1", "uid": "u1"}, "status": {"podIP": "10.0.0.7"}}
EGRESS = {"proxy_port": 3128, "code_env": {}}


async def delivered(status: int, content: bytes, egress: dict | None = EGRESS) -> bool:
    answer = httpx.MockTransport(lambda request: httpx.Response(status, content=content))
    async with httpx.AsyncClient(transport=answer) as http:
        ctx = SimpleNamespace(http=http, pool=None)
        return await deliver_token(ctx, POD, "key", "token", egress)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("content", "said"),
    [
        (b"[]", "not a JSON object: list"),
        (b'"proxy_port"', "not a JSON object: str"),
        (b"null", "not a JSON object: NoneType"),
        (b"<html>", "not JSON"),
        (b'{"network": ["proxy_port"]}', "names no network"),
        (b"{}", "names no network"),
        (b'{"network": "deny"}', "deny"),
    ],
)
async def test_a_claim_answer_without_the_network_asked_for_is_a_refusal(
    content: bytes, said: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, "sandbox_workspace.operator.pool"):
        assert await delivered(200, content) is False
    (record,) = caplog.records
    assert record.getMessage() == "claimed pod did not take the network asked for"
    assert said in record.answered and record.pod == "pool-1"  # type: ignore[attr-defined]


async def test_the_network_asked_for_is_a_delivery_and_no_network_asked_needs_none() -> None:
    assert await delivered(200, b'{"network": "proxy_port"}') is True
    assert await delivered(200, b"[]", egress=None) is True  # the token alone: 200 says it
    assert await delivered(403, b'{"network": "proxy_port"}') is False
