"""runtime/client.py: the one runtime client — its path-segment encoder and its error
contract (what the API relays, what the operator retries)."""

from __future__ import annotations

import httpx
import pytest

from sandbox_workspace.runtime.client import (
    RuntimeBadAnswer,
    RuntimeClient,
    RuntimeRefused,
    RuntimeUnavailable,
    segment,
)


@pytest.mark.parametrize(
    ("value", "encoded"),
    [
        pytest.param("c1", "c1", id="plain"),
        pytest.param("..", "%2E%2E", id="dot-dot"),
        pytest.param(".", "%2E", id="dot"),
        pytest.param("c1/uploads/x.csv", "c1%2Fuploads%2Fx%2Ecsv", id="slashes"),
        pytest.param("a b?#%", "a%20b%3F%23%25", id="reserved"),
        pytest.param("é", "%C3%A9", id="unicode"),
    ],
)
def test_segment_escapes_everything_but_unreserved(value: str, encoded: str) -> None:
    assert segment(value) == encoded


async def sent_path(cid: str) -> bytes:
    seen: list[bytes] = []

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request.url.raw_path)
        return httpx.Response(200, json={"conversation_id": cid, "deleted": True})

    async with httpx.AsyncClient(transport=httpx.MockTransport(handle)) as http:
        await RuntimeClient(http, "http://rt:8080", "t").delete_conversation(cid)
    return seen[0]


@pytest.mark.parametrize("cid", ["..", ".", "c1/uploads/x.csv", "c1/../c2"])
async def test_an_id_never_addresses_another_resource(cid: str) -> None:
    """httpx normalises dot segments; an encoded one stays a single segment."""
    path = await sent_path(cid)
    prefix = b"/v1/conversations/"
    assert path.startswith(prefix) and b"/" not in path[len(prefix) :]


def answer(status: int, body: object = None, exc: Exception | None = None):
    def handle(request: httpx.Request) -> httpx.Response:
        if exc is not None:
            raise exc
        return httpx.Response(status, json=body) if body is not None else httpx.Response(status)

    return handle


@pytest.mark.parametrize(
    ("handler", "expected", "status", "code"),
    [
        pytest.param(
            answer(404, {"error": {"code": "not_found", "message": "no"}}),
            RuntimeRefused,
            404,
            "not_found",
            id="4xx-relayed",
        ),
        pytest.param(
            answer(409, {"error": {"code": "conversation_deleting", "message": "later"}}),
            RuntimeRefused,
            409,
            "conversation_deleting",
            id="409-relayed",
        ),
        pytest.param(
            answer(503, {"error": {"code": "confinement_unavailable", "message": "m"}}),
            RuntimeRefused,
            503,
            "confinement_unavailable",
            id="5xx-with-error-relayed",
        ),
        pytest.param(answer(500), RuntimeBadAnswer, 502, "bad_gateway", id="5xx-bare"),
        pytest.param(
            answer(401, {"error": {"code": "unauthorized", "message": "m"}}),
            RuntimeBadAnswer,
            502,
            "bad_gateway",
            id="our-token-refused",
        ),
        pytest.param(
            answer(0, exc=httpx.ConnectError("refused")),
            RuntimeUnavailable,
            503,
            "unavailable",
            id="unreachable",
        ),
        pytest.param(answer(200, {"odd": 1}), RuntimeBadAnswer, 502, "bad_gateway", id="bad-body"),
    ],
)
async def test_errors_say_what_happened(handler, expected, status, code) -> None:
    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as http:
        with pytest.raises(expected) as err:
            await RuntimeClient(http, "http://rt:8080", "t").conversation_info("c1")
    assert (err.value.status, err.value.code) == (status, code)


def test_retryable_refusals() -> None:
    assert RuntimeRefused(409, "conversation_deleting", "m").retryable
    assert RuntimeRefused(503, "x", "m").retryable
    assert not RuntimeRefused(400, "invalid_conversation_id", "m").retryable
