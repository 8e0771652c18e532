"""Uploads in store mode: one pass over the request body feeds the sandbox's cache and the
object store at once (a tee), in flat memory.

Contract (``TeeUpload``):
- ``open`` reads the body until the ``file`` part's headers, holding only what comes
  before them (the small form fields, at most ``_MAX_PREFIX`` bytes). By then the file's
  name is known (the ``path`` form field — checked by ``check_upload_path`` — else the
  part's filename) and so is its conversation (given by the caller, else a
  ``conversation_id`` field before the file): a store put of the file's key starts.
- When the put starts, the upload goes to the runtime raw (``runtime.raw_upload``): the
  file part's bytes are hashed and handed, in 1 MiB chunks, both to the put (through a
  queue of ``_QUEUE`` chunks: the slower side sets the pace; memory is the queue plus the
  put's parts in flight) and to the runtime, and after them the trailer: the fields the
  runtime applies (``conversation_id``, ``subdir``, ``path``), the size and the digest. So
  the runtime neither parses the form nor hashes the bytes again. What the runtime would
  refuse in a form (a second file, a malformed body, no closing boundary, a field that is
  not UTF-8) is refused here with its words, and the runtime sees an incomplete body.
  The ``conversation_id`` the put's key used goes with it: a later field that names
  another makes the runtime refuse the upload.
- Without a put, ``body()`` is the client's body, unchanged, for the runtime's form route
  (which applies every limit; a ``path`` goes to it as the ``name`` parameter).
- The put's body ends only when ``settle`` is called. With the runtime's answer, when its
  size and SHA-256 are the ones computed here, the object is completed and its ETag
  answered; otherwise (the runtime refused, the body failed, the sizes, digests or
  conversations disagree, the form was not understood) the put's body raises, the
  multipart upload is abandoned and the key keeps what it held. ``settle`` answers None
  then: the caller copies the file from the cache afterwards (write-back), as it does for
  every file code writes.
- Without a conversation before the file (its field after it) no put starts (``key`` is
  None): the same write-back copies the file once the runtime has it. So it goes too
  when the runtime does not take raw uploads (``raw=False``: a runtime of an older
  release, running on through an upgrade).
- A ``path`` field after the file (the runtime names the file by it; the bytes sent went
  to another key) abandons the put: the write-back copies the file. A bad ``path``, a
  form field too long, or a store failure while the body streams is raised out of
  ``body()`` (kept in ``error``): the runtime sees an incomplete body, commits nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections.abc import AsyncIterator, Callable

from python_multipart.multipart import parse_options_header

from sandbox_workspace.contract import ids
from sandbox_workspace.contract.errors import ApiError, BadRequest
from sandbox_workspace.runtime.raw_upload import Trailer, encode_trailer
from sandbox_workspace.runtime.schemas import UploadResult
from sandbox_workspace.runtime.uploads import (
    MAX_FIELD_BYTES,
    READ_FIELDS,
    html5_unescape,
    repeated_field_message,
)
from sandbox_workspace.store import ObjectStore
from sandbox_workspace.store.layout import RESERVED

from ..upload_guard import FormField
from .store_cache import UPLOADS

_CHUNK = 1024 * 1024
_QUEUE = 4
_MAX_PREFIX = 256 * 1024
_MAX_FIELD = MAX_FIELD_BYTES  # the runtime's limit of a form field
_RUNTIME_FIELDS = (b"conversation_id", b"subdir", b"path")  # what a raw trailer carries


def check_upload_path(path: str) -> str:
    """An upload's ``path``: where to keep the file inside the conversation's uploads —
    one file name, since uploads are flat in v1 (``uploads/temparea/{name}``). Refused
    (400 ``invalid_path``, saying why): empty, absolute, ``..``/``.``, NUL, ``\\``, control
    characters, a name over 255 bytes, the metadata's ``.sbw/``, any subdirectory."""
    try:
        parts = ids.split_relative(path, what="path")
    except ids.UnsafePath as e:
        raise BadRequest(str(e), code="invalid_path") from e
    if len(parts) > 1 and parts[0] == RESERVED:
        raise BadRequest(
            f"path must not be under {RESERVED}/ (reserved for the workspace's metadata)",
            code="invalid_path",
        )
    if len(parts) != 1:
        raise BadRequest(
            "path must be one file name: the uploads of a conversation are flat in v1 "
            f"(kept at {UPLOADS}{{name}})",
            code="invalid_path",
        )
    return ids.file_name_or_400(parts[0])


class _Abandoned(Exception):
    """The put's body was told not to complete the object."""


class _Form(FormField):
    """Every small field of a multipart form, and the ``file`` part's bytes and digest."""

    def __init__(self, content_type: str) -> None:
        super().__init__(content_type, b"", _MAX_FIELD)
        self.fields: dict[bytes, bytearray] = {}
        self.after_file: set[bytes] = set()
        self.filename: bytes | None = None
        self.field_name = b""
        self.too_long: bytes | None = None  # a field longer than the runtime takes
        self.repeated: bytes | None = None  # a small field sent twice
        self.in_file = self.file_seen = self.file_done = self.second_file = False
        self.data: list[bytes] = []  # the file's bytes not yet handed on
        self.pending = 0
        self.digest = hashlib.sha256()
        self.size = 0

    def _headers_done(self) -> None:
        _, params = parse_options_header(self._headers.get(b"content-disposition", b""))
        name = params.get(b"name", b"")
        self.in_file = name == b"file"
        self._in_field = not self.in_file
        if self.in_file:
            if self.file_seen:
                self.invalid = self.second_file = True  # the runtime refuses a second file
            self.file_seen = True
            self.filename = params.get(b"filename")
        else:
            self.field_name = name
            if name in self.fields and name.decode("latin-1") in READ_FIELDS:
                self.invalid, self.repeated = True, name  # the runtime refuses a repeat
                self.value = None  # and its value is not read
                return
            self.value = self.fields[name] = bytearray()
            if self.file_seen:
                self.after_file.add(name)

    def _data(self, data: bytes, start: int, end: int) -> None:
        if self.in_file:
            piece = data[start:end]  # the chunk itself (no copy) when all of it is file
            self.digest.update(piece)
            self.data.append(piece)
            self.pending += end - start
            self.size += end - start
        elif not self.invalid:  # a field refused already (repeated) is not read on
            super()._data(data, start, end)
            if self.invalid and self.too_long is None:
                self.too_long = self.field_name

    def _end(self) -> None:
        if self.in_file:
            self.file_done = True
        self.in_file = False
        super()._end()

    def field(self, name: bytes) -> str | None:
        value = self.fields.get(name)
        try:
            return None if value is None else value.decode()
        except UnicodeDecodeError:
            return None


class TeeUpload:
    def __init__(
        self,
        store: ObjectStore,
        key_for: Callable[[str, str], str],
        source: AsyncIterator[bytes],
        content_type: str,
        conversation_id: str | None,
        *,
        raw: bool = True,
    ) -> None:
        self.store = store
        self.raw_ok = raw  # the runtime takes raw uploads (else: no put, the form as is)
        self.key_for = key_for
        self.source = aiter(source)
        self.form = _Form(content_type)
        self.given = conversation_id
        self.prefix: list[bytes] = []
        self.key: str | None = None
        self.name: str | None = None
        self.conversation: str | None = None
        self.error: ApiError | None = None
        self._queue: asyncio.Queue[bytes | None] = asyncio.Queue(_QUEUE)
        self._ended = False
        self._late_path = False  # a path field after the file: no put, the write-back copies
        self._settled: asyncio.Future[bool] | None = None
        self._task: asyncio.Task[str] | None = None

    # -- before the runtime request -----------------------------------------------------

    async def open(self) -> dict[str, str]:
        """Read up to the file's headers, start the put; answer the runtime's parameters."""
        held = 0
        while not self.form.file_seen and not self.form.invalid and held <= _MAX_PREFIX:
            chunk = await anext(self.source, None)
            if chunk is None:
                break
            self.prefix.append(chunk)
            held += len(chunk)
            self.form.feed(chunk)
        params: dict[str, str] = {}
        if self.form.repeated is not None:
            self.error = BadRequest(repeated_field_message(self.form.repeated.decode("latin-1")))
            raise self.error
        if (path := self.form.field(b"path")) is not None:
            self.name = params["name"] = check_upload_path(path)
        cid = self.given or self.form.field(b"conversation_id")
        if self.raw_ok and self.form.file_seen and not self.form.invalid and cid is not None:
            try:
                cid = ids.conversation_id_or_400(cid)
                if self.name is None:
                    raw = (self.form.filename or b"").decode()
                    self.name = ids.file_name_or_400(html5_unescape(raw))
                self.key = self.key_for(cid, self.name)
                self.conversation = cid
            except (ApiError, UnicodeDecodeError, ValueError):
                self.key = None  # the runtime refuses it, with its own message
        if self.key is not None:
            self._settled = asyncio.get_running_loop().create_future()
            self._task = asyncio.create_task(self.store.put(self.key, self._put_body()))
            # Everything the runtime needs before the file's first byte is known.
            assert self.conversation is not None and self.form.filename is not None
            params["conversation_id"] = self.conversation
            params["filename"] = html5_unescape(self.form.filename.decode())
        return params

    @property
    def raw(self) -> bool:
        """The runtime gets the file's bytes and a trailer, not the form: exactly when the
        put started (``open``)."""
        return self._task is not None

    # -- the runtime's body -------------------------------------------------------------

    async def body(self) -> AsyncIterator[bytes]:
        """The runtime's body: the client's, unchanged; in raw mode the file's bytes (the
        chunks the store gets) and then the trailer (``runtime.raw_upload``)."""
        for chunk in self.prefix:  # fed to the form by open()
            if out := await self._forward(chunk):
                yield out
        self.prefix = []
        async for chunk in self.source:
            if chunk:
                self.form.feed(chunk)
                if out := await self._forward(chunk):
                    yield out
        if out := await self._forward(b"", final=True):
            yield out
        if self.raw:
            yield self._trailer()

    async def _forward(self, chunk: bytes, *, final: bool = False) -> bytes:
        """Check the form so far, hand the file's bytes to the put; answer what goes on to
        the runtime (in raw mode the file's bytes, by the ``_CHUNK``)."""
        form = self.form
        if self.error is None and form.too_long is not None:
            name = form.too_long.decode(errors="replace")
            code = "invalid_description" if name == "description" else "invalid_form_field"
            self.error = BadRequest(
                f"form field '{name}' must be at most {_MAX_FIELD} bytes", code=code
            )
        if self.error is None and self.raw:
            self.error = self._raw_error(final)
        if b"path" in form.after_file and not self._late_path:
            # The key is the file's name: the bytes already sent went to another one.
            self._late_path = True
            await self._end_put()
        if self.error is None and self._late_path and final:
            try:
                check_upload_path(form.field(b"path") or "")
            except ApiError as e:
                self.error = e
        if self.error is not None:
            raise self.error
        if not self.raw:  # no put: the client's body goes on as it is
            form.data.clear()
            form.pending = 0
            return chunk
        out = b""
        if form.pending >= _CHUNK or (form.data and (form.file_done or final)):
            piece = b"".join(form.data)
            form.data.clear()
            form.pending = 0
            if not self._ended:
                await self._push(piece)
            out = piece
        if form.file_done or final or form.invalid:
            await self._end_put()
        return out

    def _raw_error(self, final: bool) -> ApiError | None:
        """What the runtime would have refused in the form, found here in raw mode (the
        runtime does not see the form): said as the runtime says it."""
        form = self.form
        if form.second_file:
            return BadRequest("send one file per request in the 'file' field")
        if form.repeated is not None:
            return BadRequest(repeated_field_message(form.repeated.decode("latin-1")))
        if form.malformed:
            return BadRequest("malformed multipart body")
        if final and not form.complete:
            return BadRequest("multipart body ended before its closing boundary")
        return None

    def _trailer(self) -> bytes:
        """The form's fields the runtime applies, the file's size and digest."""
        fields = {}
        for name in _RUNTIME_FIELDS:
            if name in self.form.fields:
                value = self.form.field(name)
                if value is None:
                    self.error = BadRequest(f"form field '{name.decode()}' must be UTF-8 text")
                    raise self.error
                fields[name.decode()] = value
        trailer = Trailer(fields=fields, size=self.form.size, sha256=self.digest)
        return encode_trailer(trailer)

    async def _end_put(self) -> None:
        if self._task is not None and not self._ended:
            self._ended = True
            await self._push(None)

    async def _push(self, item: bytes | None) -> None:
        task = self._task
        assert task is not None
        if task.done():
            self._raise_store_error(task)
        if not self._queue.full():
            self._queue.put_nowait(item)
            return
        put = asyncio.ensure_future(self._queue.put(item))
        await asyncio.wait({put, task}, return_when=asyncio.FIRST_COMPLETED)
        if not put.done():
            put.cancel()
            self._raise_store_error(task)

    def _raise_store_error(self, task: asyncio.Task) -> None:
        e = task.exception() if not task.cancelled() else None
        self.error = e if isinstance(e, ApiError) else BadRequest("upload abandoned")
        raise self.error

    # -- the store's body ---------------------------------------------------------------

    async def _put_body(self) -> AsyncIterator[bytes]:
        while (chunk := await self._queue.get()) is not None:
            yield chunk
        assert self._settled is not None
        if not await self._settled:
            raise _Abandoned()

    async def settle(self, result: UploadResult | None) -> str | None:
        """Complete the object when ``result`` is the bytes sent; answer its ETag, or None
        when there is no object (abandoned, or never started)."""
        if self._task is None or self._settled is None or self._settled.done():
            return None  # no put, or settled already
        form = self.form
        ok = (
            result is not None
            and self._ended
            and form.file_done
            and not form.invalid
            and not self._late_path
            and result.name == self.name
            and result.conversation_id == self.conversation
            and result.size == form.size
            and result.sha256 == form.digest.hexdigest()
        )
        self._settled.set_result(ok)
        if not ok:
            self._abandon()
        try:
            etag = await self._task
        except Exception:  # abandoned on purpose, or the store failed
            if ok:
                raise
            return None
        return etag if ok else None

    def _abandon(self) -> None:
        # The put may wait for chunks that will never come: end its body.
        with contextlib.suppress(asyncio.QueueEmpty):
            while True:
                self._queue.get_nowait()
        self._queue.put_nowait(None)

    @property
    def digest(self) -> str:
        return self.form.digest.hexdigest()

    def description(self) -> str | None:
        return self.form.field(b"description")

    def original_name(self) -> str | None:
        """The file part's own filename (kept as ``original_name`` when ``path`` renames)."""
        try:
            return html5_unescape(self.form.filename.decode()) if self.form.filename else None
        except UnicodeDecodeError:
            return None
