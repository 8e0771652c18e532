"""Secrets injected on the way out (issue 40 item 3): where values come from, where the
placeholder is swapped, and how values are kept out of what goes back to the sandbox.

Contract:
- ``SecretSource.value(session_id, name)`` is the only way the proxy learns a value.
  The cluster wiring answers from the Kubernetes Secret the platform names; tests use
  ``MemorySecretSource``. ``None`` means "no such secret for this session": the proxy
  then refuses the request instead of sending the placeholder.
- ``swap_headers`` swaps a binding's placeholder for the value in exactly one place: a
  header named ``binding.header`` whose whole value is ``binding.prefix + placeholder``
  (the prefix compared without case: ``bearer`` works too). A placeholder anywhere else
  (the URL, the body, another header, the bound header with extra text) is sent as the
  sandbox wrote it. So the value goes only where the binding says.
- ``Scrubber`` masks every occurrence of the injected values in the bytes relayed back,
  with ``*`` of the same length (lengths and framing stay valid), across chunk
  boundaries. It sees the bytes as the upstream sent them: a value the host echoes
  encoded (base64, JSON escapes, compressed, split by chunked framing) is not found.
  Reading a secret back through an echoing host is that host's own business.
- A value must be 8 to 4096 printable ASCII characters: no CR, LF or NUL could split a
  header, and a very short value would make the scrubber mask ordinary bytes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from .policy import SecretBinding

MIN_VALUE, MAX_VALUE = 8, 4096


class SecretSource(Protocol):
    async def value(self, session_id: str, name: str) -> str | None:
        """The value of secret ``name`` for ``session_id``, or None when it has none."""
        ...


class MemorySecretSource:
    """Values held in memory, by session then name (tests, the local backend)."""

    def __init__(self, values: Mapping[str, Mapping[str, str]] | None = None) -> None:
        self.values: dict[str, dict[str, str]] = {s: dict(v) for s, v in (values or {}).items()}

    async def value(self, session_id: str, name: str) -> str | None:
        return self.values.get(session_id, {}).get(name)


class SecretUnavailable(Exception):
    """The request needs a secret that cannot be used; the message names it, never a value."""


def checked_value(name: str, value: str | None) -> bytes:
    if value is None:
        raise SecretUnavailable(f"secret {name!r} has no value for this session")
    if not MIN_VALUE <= len(value) <= MAX_VALUE or not all(32 <= ord(c) < 127 for c in value):
        raise SecretUnavailable(
            f"secret {name!r} is not usable in a header: {MIN_VALUE}-{MAX_VALUE} printable "
            "ASCII characters"
        )
    return value.encode("ascii")


def _binding_at(
    name: bytes, value: bytes, bindings: Sequence[SecretBinding]
) -> SecretBinding | None:
    """The binding whose place this header is, with its placeholder in it."""
    for binding in bindings:
        expected = (binding.prefix + binding.placeholder).encode("ascii")
        if name == binding.header.encode("ascii") and value.lower() == expected.lower():
            return binding
    return None


def bound_in(
    headers: Sequence[tuple[bytes, bytes]], bindings: Sequence[SecretBinding]
) -> list[str]:
    """Names of the secrets whose placeholder sits in its bound place in ``headers``
    ((lower-case name, stripped value) pairs as ``parse_headers`` gives)."""
    found = (_binding_at(name, value, bindings) for name, value in headers)
    return list(dict.fromkeys(b.name for b in found if b is not None))


def swap_headers(
    headers: Sequence[tuple[bytes, bytes]],
    bindings: Sequence[SecretBinding],
    values: Mapping[str, bytes],
) -> list[tuple[bytes, bytes]]:
    """The headers with each placeholder in its bound place replaced by its value
    (``values`` holds at least the names ``bound_in`` gave)."""
    out = []
    for name, value in headers:
        binding = _binding_at(name, value, bindings)
        if binding is not None:
            value = value[: len(binding.prefix)] + values[binding.name]
        out.append((name, value))
    return out


class Scrubber:
    """Masks ``values`` in a byte stream fed in pieces: ``feed`` returns what is safe to
    send now (it holds back the last ``longest - 1`` bytes, which could start a value),
    ``flush`` the rest at the end."""

    def __init__(self, values: Sequence[bytes]) -> None:
        self.values = sorted({v for v in values if v}, key=len, reverse=True)
        self.keep = max((len(v) for v in self.values), default=1) - 1
        self.pending = b""

    def _mask(self, data: bytes) -> bytes:
        for value in self.values:
            data = data.replace(value, b"*" * len(value))
        return data

    def feed(self, data: bytes) -> bytes:
        if not self.values:
            return data
        data = self._mask(self.pending + data)
        cut = max(len(data) - self.keep, 0)
        self.pending = data[cut:]
        return data[:cut]

    def flush(self) -> bytes:
        out, self.pending = self._mask(self.pending), b""
        return out
