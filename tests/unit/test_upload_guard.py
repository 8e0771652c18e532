"""The upload guard: the last chunk waits until the conversation is opened, with the id
the runtime will use — whatever order or repetition of form fields a client sends."""

from __future__ import annotations

import asyncio

import pytest

from sandbox_workspace.api.upload_guard import GuardedBody
from sandbox_workspace.contract.errors import ConversationDeleting

BOUNDARY = "b0undary"
CONTENT_TYPE = f"multipart/form-data; boundary={BOUNDARY}"


def field(name: str, value: str, filename: str | None = None) -> bytes:
    disposition = f'form-data; name="{name}"' + (f'; filename="{filename}"' if filename else "")
    return f"--{BOUNDARY}\r\nContent-Disposition: {disposition}\r\n\r\n{value}\r\n".encode()


def form(*parts: bytes) -> bytes:
    return b"".join(parts) + f"--{BOUNDARY}--\r\n".encode()


def chunks(data: bytes, size: int) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)]


def run_guard(data: bytes, given: str | None = None, size: int = 7, refuse: bool = False):
    events: list[tuple[str, object]] = []

    async def source():
        for chunk in chunks(data, size):
            yield chunk

    async def open_conversation(cid: str) -> None:
        events.append(("open", cid))
        if refuse:
            raise ConversationDeleting(cid)

    async def main():
        guard = GuardedBody(source(), CONTENT_TYPE, given, open_conversation)
        try:
            async for chunk in aiter(guard):
                events.append(("chunk", chunk))
        except ConversationDeleting as e:
            events.append(("raised", e))
        return guard

    guard = asyncio.run(main())
    return guard, events


def test_last_chunk_waits_for_the_conversation_to_be_opened():
    data = form(field("conversation_id", "c1"), field("file", "x" * 50, "a.csv"))
    guard, events = run_guard(data)
    kinds = [k for k, _ in events]
    assert kinds.count("open") == 1 and kinds[-1] == "chunk" and kinds[-2] == "open"
    assert b"".join(c for k, c in events if k == "chunk") == data
    assert guard.opened == "c1" and guard.error is None


@pytest.mark.parametrize(
    ("parts", "expected"),
    [
        pytest.param(
            [field("file", "data", "a.csv"), field("conversation_id", "late")], "late", id="after"
        ),
        pytest.param(
            [
                field("conversation_id", "first"),
                field("file", "d", "a"),
                field("conversation_id", "b"),
            ],
            "b",
            id="repeated-last-wins",
        ),
        pytest.param(
            [field("conversation_id", "as-file", "x.txt"), field("file", "d", "a")],
            "as-file",
            id="field-sent-as-file-part",
        ),
    ],
)
def test_the_id_is_the_one_the_runtime_picks(parts, expected):
    _, events = run_guard(form(*parts), size=3)
    assert [v for k, v in events if k == "open"] == [expected]


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(form(field("file", "d", "a")), id="no-id"),
        pytest.param(form(field("conversation_id", "../x"), field("file", "d", "a")), id="invalid"),
        pytest.param(form(field("conversation_id", "x" * 5000), field("file", "d")), id="too-long"),
        pytest.param(b"not multipart at all", id="garbage"),
    ],
)
def test_nothing_is_opened_for_an_upload_the_runtime_refuses(data):
    _guard, events = run_guard(data)
    assert not [e for e in events if e[0] == "open"]
    assert b"".join(c for k, c in events if k == "chunk") == data  # relayed unchanged


def test_a_given_id_is_used_without_parsing():
    data = form(field("file", "d", "a"))
    _guard, events = run_guard(data, given="c9")
    assert [v for k, v in events if k == "open"] == ["c9"]


def test_a_refusal_aborts_the_body_before_its_end_and_is_kept():
    data = form(field("conversation_id", "c1"), field("file", "x" * 40, "a.csv"))
    guard, events = run_guard(data, size=10, refuse=True)
    sent = b"".join(c for k, c in events if k == "chunk")
    assert isinstance(guard.error, ConversationDeleting)
    assert events[-1] == ("raised", guard.error), "raised: the transport aborts the request"
    assert data.startswith(sent) and len(sent) < len(data)
