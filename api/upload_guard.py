"""Hold an upload's last chunk until its conversation is known to be tracked.

Contract: ``GuardedBody(body, content_type, conversation_id, open_conversation)``
iterates ``body`` unchanged, one chunk behind. When the source ends — before the last
chunk goes out — it awaits ``open_conversation(cid)``, with ``cid`` from the multipart
form's ``conversation_id`` field or else the given one (the runtime's own rule). The
runtime commits an upload only after the closing boundary, which is in the last chunk,
so no byte of the conversation can land before the conversation is tracked (kubernetes:
its ConversationWorkspace with the finalizer exists) and not being deleted. When
``open_conversation`` raises, the error is kept in ``.error`` (for the route to answer
instead of whatever the transport says) and raised out of the body: the request to the
runtime is aborted before its body is complete, and the runtime, which commits only
after a complete body, discards what it staged. (Ending the body gracefully instead
would not do: a client can put the closing boundary early and pad the epilogue.)

When the id is not given as a parameter the whole form is parsed (as the runtime parses
it, the last ``conversation_id`` part counts — so a second, different field cannot slip
a write past the guard); when it is given, nothing is parsed: a form value that
disagrees makes the runtime refuse the upload. An id that is not valid opens nothing (the
runtime refuses the upload with a 400 that says why).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

from python_multipart.multipart import MultipartParser, parse_options_header

from sandbox_workspace.contract import ids
from sandbox_workspace.contract.errors import ApiError
from sandbox_workspace.runtime.uploads import MAX_FIELD_BYTES

_FIELD = b"conversation_id"
# The runtime's own limit: a value the guard gives up on is one the runtime refuses (the
# whole upload). A lower limit here let a long first value hide a later, valid one that
# the runtime then took — and the guard had opened nothing.
_MAX_VALUE = MAX_FIELD_BYTES


class FormField:
    """Collects the last value of one form field (``conversation_id`` unless told) from a
    streamed multipart body, fed chunk by chunk (``feed``); never holds more than
    ``limit`` bytes of it (longer: ``invalid``)."""

    def __init__(self, content_type: str, name: bytes = _FIELD, limit: int = _MAX_VALUE) -> None:
        self.name, self.limit = name, limit
        self.value: bytearray | None = None
        self.invalid = False
        self.malformed = False  # the parser refused the body
        self.complete = False  # the closing boundary came
        self._header = b""
        self._headers: dict[bytes, bytes] = {}
        self._in_field = False
        mime, params = parse_options_header(content_type)
        boundary = params.get(b"boundary")
        self.parser = (
            MultipartParser(
                boundary,
                {
                    "on_part_begin": self._begin,
                    "on_header_field": self._field,
                    "on_header_value": self._value,
                    "on_header_end": self._header_end,
                    "on_headers_finished": self._headers_done,
                    "on_part_data": self._data,
                    "on_part_end": self._end,
                    "on_end": self._complete,
                },
            )
            if mime == b"multipart/form-data" and boundary
            else None
        )
        self._name = b""
        self._raw = b""

    def feed(self, chunk: bytes) -> None:
        if self.parser is None or self.invalid:
            return
        try:
            self.parser.write(chunk)
        except Exception:  # malformed: the runtime refuses it, with its own message
            self.invalid = self.malformed = True

    def _begin(self) -> None:
        self._headers, self._in_field = {}, False

    def _field(self, data: bytes, start: int, end: int) -> None:
        self._name += data[start:end]

    def _value(self, data: bytes, start: int, end: int) -> None:
        self._raw += data[start:end]

    def _header_end(self) -> None:
        self._headers[self._name.lower()] = self._raw
        self._name, self._raw = b"", b""

    def _headers_done(self) -> None:
        _, params = parse_options_header(self._headers.get(b"content-disposition", b""))
        self._in_field = params.get(b"name") == self.name
        if self._in_field:
            self.value = bytearray()

    def _data(self, data: bytes, start: int, end: int) -> None:
        if self._in_field and self.value is not None:
            self.value += data[start:end]
            if len(self.value) > self.limit:
                self.invalid = True

    def _end(self) -> None:
        self._in_field = False

    def _complete(self) -> None:
        self.complete = True

    def text(self) -> str | None:
        if self.value is None or self.invalid:
            return None
        try:
            return self.value.decode()
        except UnicodeDecodeError:
            return None


class GuardedBody:
    def __init__(
        self,
        body: AsyncIterator[bytes],
        content_type: str,
        conversation_id: str | None,
        open_conversation: Callable[[str], Awaitable[None]],
    ) -> None:
        self.body = body
        self.given = conversation_id
        self.open_conversation = open_conversation
        self.error: ApiError | None = None
        self.opened: str | None = None
        self._finder = FormField(content_type) if conversation_id is None else None

    def _conversation(self) -> str | None:
        cid = self.given if self._finder is None else self._finder.text()
        if cid is None:
            return None
        try:
            return ids.conversation_id_or_400(cid)
        except ApiError:
            return None

    async def __aiter__(self) -> AsyncIterator[bytes]:
        held: bytes | None = None
        async for chunk in self.body:
            if not chunk:  # the server's end-of-body marker: holding it back holds nothing
                continue
            if held is not None:
                yield held
            if self._finder is not None:
                self._finder.feed(chunk)
            held = chunk
        cid = self._conversation()
        if cid is not None:
            try:
                await self.open_conversation(cid)
                self.opened = cid
            except ApiError as e:
                self.error = e
                raise  # aborts the runtime request: it never sees a complete body
        if held is not None:
            yield held
