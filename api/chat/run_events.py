"""A run's event log read back as events, cut into the segments turn-based protocols see.

Contract:
- ``parse_frame`` is the inverse of ``sse.encode_event``: the log keeps SSE frames (see
  runs.py), and the other vocabularies (AI SDK UI message stream, AG-UI) are translations
  of the same events, so one engine serves all three.
- Segments: the AI SDK and AG-UI have no mid-response channel for an approval; a response
  ends when the run asks for one, and the client's next request carries the answer and
  continues the same run. A run's log is thus a sequence of segments, each ending at a
  ``tool_approval`` event or at the run's end; a resumed stream replays every segment
  so far as one (``decided_approvals`` are those that no longer end one).
- The log and the approvals still open are read through the run store
  (``RunStore.frames`` / ``open_approvals``), so a run held by another replica reads the
  same as one held here.
- ``approval_id(run_id, call_id)`` names an approval across requests; ``parse_approval_id``
  refuses anything else with a 400 that says what an approval id looks like.
- ``translated`` answers a run's stream from an event id through a translator until the
  translator says its segment ended (or the run did); an empty batch marks a quiet
  ``idle`` period. ``translation`` is the step it applies to each batch of the log.
  A text delta continuing an open text part — one per token, nearly every event — takes
  a short way: its frame is built from the delta's JSON string as the log holds it
  (``raw_delta``, ``Translator.delta_frame``, the part's prefix built once), byte for
  byte what parsing, translating and encoding it would give (tested), at a fraction of
  the CPU (bench/chat.py: the other routes cost ~25 µs more per event than /chat's
  pass-through without it).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from json.encoder import encode_basestring
from typing import Any

from sandbox_workspace.contract.errors import BadRequest, NotFoundError

from ..event_stream import EventStream
from .run import Run
from .runstore import RunStore

_SEPARATOR = ":"  # run ids are "run_<hex>": the first ':' splits an approval id


@dataclass(frozen=True)
class RunEvent:
    id: int
    kind: str
    data: dict[str, Any]


def parse_frame(frame: bytes) -> RunEvent:
    event_id, kind, data = 0, "", "{}"
    for line in frame.decode().split("\n"):
        if line.startswith("id: "):
            event_id = int(line[4:])
        elif line.startswith("event: "):
            kind = line[7:]
        elif line.startswith("data: "):
            data = line[6:]
    return RunEvent(event_id, kind, json.loads(data))


_TEXT = b'\nevent: text\ndata: {"delta":'  # a text event's frame (sse.encode_event)


def raw_delta(frame: bytes) -> bytes | None:
    """A text event's delta as its frame holds it — a JSON string, escapes and all — or
    None for any other event."""
    start = frame.find(_TEXT)
    if start < 0 or not frame.endswith(b"}\n\n"):
        return None
    return frame[start + len(_TEXT) : -3]


def json_string(value: str) -> bytes:
    return encode_basestring(value).encode()


def encode_data(message: dict) -> bytes:
    """A data-only SSE frame (what both the AI SDK and AG-UI read): ``data: {json}``."""
    body = json.dumps(message, separators=(",", ":"), ensure_ascii=False)
    return b"data: " + body.encode() + b"\n\n"


async def events_of(store: RunStore, run: Run) -> list[RunEvent]:
    """The run's events stored so far (not waiting for more)."""
    return [parse_frame(frame) for frame in await store.frames(run)]


def approval_id(run_id: str, call_id: str) -> str:
    return f"{run_id}{_SEPARATOR}{call_id}"


def parse_approval_id(value: str) -> tuple[str, str]:
    run_id, sep, call_id = value.partition(_SEPARATOR)
    if not (sep and run_id.startswith("run_") and call_id):
        raise BadRequest(
            f"approval id {value[:80]!r} is not one this API issued "
            "(expected '<run id>:<tool call id>' from a tool-approval-request)",
            code="invalid_approval_id",
        )
    return run_id, call_id


async def decided_approvals(store: RunStore, run: Run) -> set[str]:
    """Tool calls whose approval was asked and answered (or timed out) — all asked but
    the one the run waits on now."""
    asked = [
        e.data["tool_call_id"] for e in await events_of(store, run) if e.kind == "tool_approval"
    ]
    waiting = await store.open_approvals(run)  # read after the log: covers all it asked
    return {call for call in asked if call not in waiting}


def approval_event_id(run_id: str, events: list[RunEvent], call_id: str) -> int:
    """The id of the event that asked for this call's approval (404 when none did)."""
    for event in events:
        if event.kind == "tool_approval" and event.data.get("tool_call_id") == call_id:
            return event.id
    raise NotFoundError(
        f"run '{run_id}' never asked to approve tool call '{call_id}'", code="unknown_tool_call"
    )


class Translator:
    """What the per-protocol translators share: one handler per event kind
    (``_on_<kind>(event, out)``), an ``opening`` before the first event, at most one open
    text part (closed before any tool step and at the end), each tool call announced
    once (``announced``: by an earlier segment), and ``ended`` once the segment's
    terminal message is out — after which it translates nothing more."""

    def __init__(self, announced: Iterable[str] = ()) -> None:
        self.ended = False
        self._started = False
        self._text: str | None = None  # id of the open text part
        self._prefix: tuple[str | None, bytes] = (None, b"")  # delta_prefix(that id)
        self._announced = set(announced)

    # The protocol's messages.
    def opening(self) -> list[dict]:
        raise NotImplementedError

    def text_start(self, text_id: str) -> dict:
        raise NotImplementedError

    def text_delta(self, text_id: str, delta: str) -> dict:
        raise NotImplementedError

    def text_end(self, text_id: str) -> dict:
        raise NotImplementedError

    def tool_call(self, call_id: str, name: str, arguments: str) -> list[dict]:
        raise NotImplementedError

    def text_id(self, event: RunEvent) -> str:
        return f"text-{event.id}"

    def delta_frame(self, raw: bytes) -> bytes | None:
        """The encoded frame of a text delta (``raw``: its JSON string, ``raw_delta``)
        continuing the open text part; None when there is none (the general way runs)."""
        text = self._text
        if text is None or self.ended or raw == b'""':
            return None
        if self._prefix[0] != text:
            self._prefix = (text, self.delta_prefix(text))
        return self._prefix[1] + raw + b"}\n\n"

    def delta_prefix(self, text_id: str) -> bytes:
        """What the encoded ``text_delta`` message has before the delta's string."""
        raise NotImplementedError

    def feed(self, event: RunEvent) -> list[dict]:
        if self.ended:
            return []
        out: list[dict] = []
        if not self._started:
            self._started = True
            out.extend(self.opening())
        handler = getattr(self, f"_on_{event.kind}", None)
        if handler is not None:
            handler(event, out)
        return out

    def _close_text(self, out: list[dict]) -> None:
        if self._text is not None:
            out.append(self.text_end(self._text))
            self._text = None

    def _announce(self, out: list[dict], call_id: str, name: str, arguments: str) -> None:
        self._close_text(out)
        if call_id not in self._announced:
            self._announced.add(call_id)
            out.extend(self.tool_call(call_id, name, arguments))

    def _on_text(self, event: RunEvent, out: list[dict]) -> None:
        delta = event.data.get("delta", "")
        if not delta:  # nothing to show (and AG-UI refuses empty deltas)
            return
        if self._text is None:
            self._text = self.text_id(event)
            out.append(self.text_start(self._text))
        out.append(self.text_delta(self._text, delta))

    def _on_tool_start(self, event: RunEvent, out: list[dict]) -> None:
        d = event.data
        self._announce(out, d["tool_call_id"], d["name"], d.get("arguments", ""))


def translation(
    translator: Translator, encode: Callable[[dict], bytes]
) -> Callable[[list[bytes]], tuple[list[bytes], bool]]:
    """The step that turns a batch of the log's frames into the translator's frames, and
    says whether its segment ended with them (nothing after that is translated)."""
    delta_frame, feed = translator.delta_frame, translator.feed

    def step(frames: list[bytes]) -> tuple[list[bytes], bool]:
        out: list[bytes] = []
        for frame in frames:
            raw = raw_delta(frame)
            if raw is not None and (delta := delta_frame(raw)) is not None:
                out.append(delta)
                continue
            out.extend(map(encode, feed(parse_frame(frame))))
            if translator.ended:
                break
        return out, translator.ended

    return step


def translated(
    run: Run,
    after: int,
    translator: Translator,
    encode: Callable[[dict], bytes],
    idle: float,
    headers: Mapping[str, str],
    tail: bytes = b"",
) -> EventStream:
    """The run's events after ``after`` in the translator's vocabulary, a batch per write
    (an empty batch is a keep-alive comment), then ``tail``."""
    return EventStream(
        run.follow(after, idle=idle),
        headers,
        transform=translation(translator, encode),
        tail=tail,
    )
