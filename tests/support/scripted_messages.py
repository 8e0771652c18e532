"""Anthropic Messages streams, scripted (test support, not product code).

Events as the Messages API streams them — ``event: <type>`` then ``data: <json>`` — for
the client's transport tests and the scripted model's ``/v1/messages`` route
(scripted_llm.py). ``from_chat_chunks`` turns a Chat Completions reply (the ``Reply``
chunks scripted_llm's helpers build) into the same answer as Messages events, so one
scripted conversation drives either provider.
"""

from __future__ import annotations

import json

_STOP = {"stop": "end_turn", "tool_calls": "tool_use", "length": "max_tokens"}


def sse(event: dict) -> bytes:
    return f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode()


def message_start(model: str = "scripted") -> dict:
    return {
        "type": "message_start",
        "message": {
            "id": "msg_scripted",
            "type": "message",
            "role": "assistant",
            "content": [],
            "model": model,
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": 10, "output_tokens": 1},
        },
    }


def text_block(index: int, pieces: list[str]) -> list[dict]:
    return [
        {
            "type": "content_block_start",
            "index": index,
            "content_block": {"type": "text", "text": ""},
        },
        *(
            {
                "type": "content_block_delta",
                "index": index,
                "delta": {"type": "text_delta", "text": p},
            }
            for p in pieces
        ),
        {"type": "content_block_stop", "index": index},
    ]


def tool_block(index: int, call_id: str, name: str, pieces: list[str]) -> list[dict]:
    """A ``tool_use`` block whose input JSON arrives in ``pieces`` (as real models send it:
    the first one empty, the rest cut anywhere, even inside a string)."""
    start = {"type": "tool_use", "id": call_id, "name": name, "input": {}}
    return [
        {"type": "content_block_start", "index": index, "content_block": start},
        *(
            {
                "type": "content_block_delta",
                "index": index,
                "delta": {"type": "input_json_delta", "partial_json": p},
            }
            for p in pieces
        ),
        {"type": "content_block_stop", "index": index},
    ]


def message_end(stop_reason: str = "end_turn") -> list[dict]:
    return [
        {
            "type": "message_delta",
            "delta": {"stop_reason": stop_reason, "stop_sequence": None},
            "usage": {"output_tokens": 15},
        },
        {"type": "message_stop"},
    ]


def from_chat_chunks(chunks: list[dict | str], finish: bool = True) -> list[dict | str]:
    """Chat Completions chunks as Messages events (text → a text block, tool-call
    fragments → tool_use blocks with input_json_delta, finish_reason → stop_reason); a
    ``str`` chunk (a raw, perhaps malformed line) passes through as it is."""
    events: list[dict | str] = [message_start(), {"type": "ping"}]
    open_block: tuple[str, int] | None = None  # ("text", index) or ("tool", call index)
    index = -1
    stop = None

    def close() -> None:
        if open_block is not None:
            events.append({"type": "content_block_stop", "index": index})

    for chunk in chunks:
        if isinstance(chunk, str):
            events.append(chunk)
            continue
        choice = chunk["choices"][0]
        delta = choice.get("delta") or {}
        if delta.get("content"):
            if open_block is None or open_block[0] != "text":
                close()
                index += 1
                open_block = ("text", 0)
                events.append(text_block(index, [])[0])
            events.append(text_block(index, [delta["content"]])[1])
        for call in delta.get("tool_calls") or ():
            function = call.get("function") or {}
            if open_block != ("tool", call.get("index", 0)):
                close()
                index += 1
                open_block = ("tool", call.get("index", 0))
                events.append(tool_block(index, call["id"], function["name"], [])[0])
            if function.get("arguments"):
                events.append(tool_block(index, "", "", [function["arguments"]])[1])
        stop = choice.get("finish_reason") or stop
    close()
    if finish:
        events += message_end(_STOP.get(stop or "stop", stop))
    return events
