"""The framing of ``POST …/outputs-batch`` answers (``output_batch``), shared by the
runtime that writes it and the client that reads it: per path, a JSON line ``{"path",
"size"}`` followed by exactly ``size`` bytes, or ``{"path", "error"}`` alone.
"""

from __future__ import annotations

import json
from dataclasses import dataclass


def frame(head: dict) -> bytes:
    return json.dumps(head, separators=(",", ":")).encode() + b"\n"


@dataclass(frozen=True)
class Frame:
    """One path's part of an answer: its bytes, or why they are not there."""

    path: str
    data: bytes | None
    error: str | None = None


def parse_frames(data: bytes) -> list[Frame]:
    """The frames of an answer of ``read_outputs`` (what the client gets)."""
    frames, at = [], 0
    while at < len(data):
        end = data.index(b"\n", at)
        head = json.loads(data[at:end])
        at = end + 1
        if "error" in head:
            frames.append(Frame(head["path"], None, head["error"]))
            continue
        size = head["size"]
        if at + size > len(data):
            raise ValueError("output batch answer cut short")
        frames.append(Frame(head["path"], data[at : at + size]))
        at += size
    return frames
