"""Collecting one execution's output: capped, decoded incrementally, optionally streamed.

Contract: ``feed`` takes raw bytes of stdout or stderr in arrival order; text is decoded
as UTF-8 without ever splitting a character across chunks; each stream keeps at most
``cap`` bytes, after which further output is dropped (not buffered) and ``truncated`` is
set. Rich results (``result``) are capped the same way, in count and in bytes
(``ResultCaps``): a result past either cap is dropped whole (a cut image is no image) and
``truncated`` is set — executed code writes them, so without a cap it could make the
runtime, and the API relaying the answer, hold any amount. Every accepted chunk and rich
result is also passed to ``on_event`` as it arrives, which is how streaming responses
deliver output before the execution ends.
"""

from __future__ import annotations

import codecs
from collections.abc import Callable
from dataclasses import dataclass

Event = dict
EventSink = Callable[[Event], None]


@dataclass(frozen=True)
class ResultCaps:
    max_results: int = 100
    max_bytes: int = 8 * 1024 * 1024

    @property
    def line_limit(self) -> int:
        """Longest event line worth reading: one result of ``max_bytes`` plus framing;
        a longer line is skipped unread (``kernel._skip_line``)."""
        return self.max_bytes + 64 * 1024


class OutputCollector:
    def __init__(
        self, cap: int, on_event: EventSink | None = None, results: ResultCaps = ResultCaps()
    ) -> None:
        self.cap = cap
        self.on_event = on_event
        self.truncated = False
        self.results: list[dict[str, str]] = []
        self._result_caps = results
        self._result_bytes = 0
        self._parts: dict[str, list[str]] = {"stdout": [], "stderr": []}
        self._kept: dict[str, int] = {"stdout": 0, "stderr": 0}
        self._decoders = {
            name: codecs.getincrementaldecoder("utf-8")("backslashreplace") for name in self._parts
        }

    def feed(self, stream: str, data: bytes) -> None:
        room = self.cap - self._kept[stream]
        if room <= 0:
            self.truncated = self.truncated or bool(data)
            return
        if len(data) > room:
            data = data[:room]
            self.truncated = True
        self._kept[stream] += len(data)
        text = self._decoders[stream].decode(data)
        self._emit(stream, text)

    def finish(self) -> None:
        for stream, decoder in self._decoders.items():
            self._emit(stream, decoder.decode(b"", final=True))

    def _emit(self, stream: str, text: str) -> None:
        if not text:
            return
        self._parts[stream].append(text)
        if self.on_event is not None:
            self.on_event({"type": stream, "text": text})

    def result(self, data: dict[str, str]) -> None:
        size = sum(len(k) + len(str(v)) for k, v in data.items())
        caps = self._result_caps
        if len(self.results) >= caps.max_results or self._result_bytes + size > caps.max_bytes:
            self.truncated = True
            return
        self._result_bytes += size
        self.results.append(data)
        if self.on_event is not None:
            self.on_event({"type": "result", "data": data})

    def text(self, stream: str) -> str:
        return "".join(self._parts[stream])
