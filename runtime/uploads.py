"""Streaming upload receiver: multipart/form-data straight to disk, limits enforced en route.

Contract: ``receive_upload`` consumes the request body chunk by chunk, never holding more
than a chunk in memory. The ``file`` part is written to a staging file while its sha256 is
computed; the size limit is checked on every chunk, the type limit as soon as the part's
headers name the file, the count limit before the file is moved into place. Any refusal
deletes the staging file, so a refused or interrupted upload leaves nothing behind. The
form fields ``conversation_id`` and ``subdir`` may come before or after the file (browsers
send them in the order the frontend appended them), or as query parameters; so may
``path`` (seed 003's: the file's name instead of the part's filename; ``name`` as a query
parameter).

With a ``ConversationQuota`` (the execution limit ``conversation_size``, which code is
held to while it runs) an upload that would take its conversation past the quota is
refused with 413 ``conversation_quota_exceeded`` and nothing is written: checked while
the file streams in as soon as the conversation is known (a query parameter or a field
before the file — the staged bytes are then at most one chunk past the room left), and
again, exactly, under the conversation's lock before the rename. A file the upload
replaces frees its room.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import anyio
from python_multipart.exceptions import FormParserError
from python_multipart.multipart import MultipartParser, parse_options_header

from sandbox_workspace.contract.errors import (
    ApiError,
    BadRequest,
    Conflict,
    TooLarge,
    UnsupportedType,
)

from .limits import disk_usage, size_text
from .schemas import UploadResult
from .workspace import Workspace

MAX_FIELD_BYTES = 4096  # a form field other than the file (api/upload_guard.py uses it)
# After refusing an upload we keep reading (and discarding) the body for a while so the
# client sees our answer instead of a reset connection; past this we stop reading.
_MAX_DRAIN_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class UploadLimits:
    max_file_size: int
    max_file_count: int
    allowed_types: tuple[str, ...] = ()

    def check_type(self, name: str) -> None:
        if not self.allowed_types:
            return
        ext = name.rsplit(".", 1)[-1].lower() if "." in name.strip(".") else ""
        if ext not in self.allowed_types:
            allowed = ", ".join(self.allowed_types)
            raise UnsupportedType(
                f"file type '.{ext}' is not allowed; allowed types: {allowed}"
                if ext
                else f"file has no extension; allowed types: {allowed}"
            )


@dataclass(frozen=True)
class ConversationQuota:
    """The bytes a conversation may hold, over ``paths(cid)`` (its directory and scratch
    space: what ``limits.TreeWatch`` measures while code runs)."""

    size: int
    paths: Callable[[str], list[str]]

    async def room(self, ws: Workspace, cid: str, name: str) -> int:
        """Bytes an upload ``name`` may bring into ``cid`` (the file it replaces freed)."""
        used = await anyio.to_thread.run_sync(disk_usage, self.paths(cid))
        return self.size - used + ws.upload_blocks(cid, name)

    def refuse(self, size: int, room: int) -> TooLarge:
        return TooLarge(
            f"the upload of {size} bytes would take the conversation past its quota of "
            f"{size_text(self.size)} ({max(room, 0)} bytes left); delete files first",
            code="conversation_quota_exceeded",
        )


@dataclass
class _Part:
    headers: dict[bytes, bytes] = field(default_factory=dict)
    field_name: str = ""
    file_name: str | None = None
    value: bytearray = field(default_factory=bytearray)


@dataclass
class _StagedFile:
    name: str
    fd: int
    size: int = 0
    digest: hashlib._Hash = field(default_factory=hashlib.sha256)


class ConversationLocks:
    """One asyncio lock per conversation, so the count check and the rename are atomic."""

    def __init__(self) -> None:
        self._locks: dict[str, asyncio.Lock] = {}

    def get(self, cid: str) -> asyncio.Lock:
        return self._locks.setdefault(cid, asyncio.Lock())


class _Receiver:
    def __init__(self, workspace: Workspace, limits: UploadLimits, name: str | None) -> None:
        self.ws = workspace
        self.name = name
        self.limits = limits
        self.events: list[tuple[str, bytes]] = []
        self.part: _Part | None = None
        self.header_field = bytearray()
        self.header_value = bytearray()
        self.fields: dict[str, str] = {}
        self.seen: set[str] = set()  # every part's field name so far
        self.staged: _StagedFile | None = None
        self.file_name: str | None = None
        self.finished = False
        self.room: int | None = None  # what the conversation's quota leaves, once known

    # Parser callbacks only record; the async side acts on them (writes may raise).
    def callbacks(self) -> dict:
        ev = self.events
        return {
            "on_part_begin": lambda: ev.append(("begin", b"")),
            "on_part_data": lambda d, s, e: ev.append(("data", bytes(d[s:e]))),
            "on_part_end": lambda: ev.append(("end_part", b"")),
            "on_header_field": lambda d, s, e: ev.append(("hfield", bytes(d[s:e]))),
            "on_header_value": lambda d, s, e: ev.append(("hvalue", bytes(d[s:e]))),
            "on_header_end": lambda: ev.append(("hend", b"")),
            "on_headers_finished": lambda: ev.append(("headers_done", b"")),
            "on_end": lambda: ev.append(("end", b"")),
        }

    def handle_events(self) -> None:
        for kind, data in self.events:
            getattr(self, f"_on_{kind}")(data)
        self.events.clear()

    def _on_begin(self, _: bytes) -> None:
        self.part = _Part()

    def _on_hfield(self, data: bytes) -> None:
        self.header_field += data

    def _on_hvalue(self, data: bytes) -> None:
        self.header_value += data

    def _on_hend(self, _: bytes) -> None:
        assert self.part is not None
        self.part.headers[bytes(self.header_field).lower()] = bytes(self.header_value)
        self.header_field.clear()
        self.header_value.clear()

    def _on_headers_done(self, _: bytes) -> None:
        part = self.part
        assert part is not None
        _, params = parse_options_header(part.headers.get(b"content-disposition", b""))
        try:
            part.field_name = params.get(b"name", b"").decode()
            raw_file = params.get(b"filename")
            part.file_name = html5_unescape(raw_file.decode()) if raw_file is not None else None
        except UnicodeDecodeError as e:
            raise BadRequest("form field and file names must be UTF-8") from e
        if part.field_name in READ_FIELDS and part.field_name in self.seen:
            # Every field read is single-valued: a repeat would silently pick one value
            # (the fuzzer found `path` sent three times, one of them "[]", stored as "[]").
            # A field no route reads is ignored, repeated or not (the document allows it).
            raise BadRequest(repeated_field_message(part.field_name))
        self.seen.add(part.field_name)
        if part.field_name == "file":
            if self.staged is not None or self.file_name is not None:
                raise BadRequest("send one file per request in the 'file' field")
            if not part.file_name and self.name is None:
                raise BadRequest("the 'file' field must carry a filename")
            self.file_name = self.ws.check_file_name(self.name or part.file_name or "")
            self.limits.check_type(self.file_name)
            name, fd = self.ws.staging.new_file()
            self.staged = _StagedFile(name=name, fd=fd)

    def _on_data(self, data: bytes) -> None:
        part = self.part
        assert part is not None
        if part.field_name == "file":
            staged = self.staged
            assert staged is not None
            staged.size += len(data)
            if staged.size > self.limits.max_file_size:
                raise TooLarge(
                    f"file is larger than the limit of {self.limits.max_file_size} bytes"
                )
            if self.room is not None and staged.size > self.room:
                return  # refused by the caller's check: nothing more is written
            staged.digest.update(data)
            view = memoryview(data)
            while view:
                written = os.write(staged.fd, view)
                view = view[written:]
        else:
            part.value += data
            if len(part.value) > MAX_FIELD_BYTES:
                raise BadRequest(f"form field '{part.field_name}' is too long")

    def _on_end_part(self, _: bytes) -> None:
        part = self.part
        assert part is not None
        if part.field_name != "file" and part.field_name:
            try:
                self.fields[part.field_name] = part.value.decode()
            except UnicodeDecodeError as e:
                raise BadRequest(f"form field '{part.field_name}' must be UTF-8 text") from e
        self.part = None

    def _on_end(self, _: bytes) -> None:
        self.finished = True

    def discard(self) -> None:
        if self.staged is not None:
            os.close(self.staged.fd)
            self.ws.staging.discard(self.staged.name)
            self.staged = None


@dataclass(frozen=True)
class UploadTarget:
    """Where one upload request goes and what holds it back: the workspace, its limits,
    locks and quota, and the request's own parameters (checked against the form's)."""

    workspace: Workspace
    limits: UploadLimits
    locks: ConversationLocks
    quota: ConversationQuota | None = None
    conversation_id: str | None = None
    subdir: str | None = None
    name: str | None = None  # names the file instead of the part's filename


async def receive_upload(
    body: AsyncIterator[bytes], content_type: str, target: UploadTarget
) -> UploadResult:
    """Stream one multipart upload into a conversation's temparea; see the module contract."""
    workspace, limits, quota = target.workspace, target.limits, target.quota
    conversation_id, name = target.conversation_id, target.name
    mime, params = parse_options_header(content_type)
    boundary = params.get(b"boundary")
    if mime != b"multipart/form-data" or not boundary:
        raise UnsupportedType(
            "upload must be multipart/form-data with a 'file' field",
            code="unsupported_content_type",
        )
    receiver = _Receiver(workspace, limits, name)
    parser = MultipartParser(boundary, receiver.callbacks())
    iterator = aiter(body)
    try:
        async for chunk in iterator:
            try:
                parser.write(chunk)
            except FormParserError as e:
                raise BadRequest(f"malformed multipart body: {e}") from e
            receiver.handle_events()
            if quota is not None and receiver.staged is not None:
                await _check_room(receiver, quota, workspace, conversation_id)
        if not receiver.finished:
            raise BadRequest("multipart body ended before its closing boundary")
        staged = receiver.staged
        if staged is None or receiver.file_name is None:
            raise BadRequest("the form has no 'file' field")
        result = await commit_staged(
            StagedUpload(
                target,
                staged.name,
                staged.fd,
                receiver.file_name,
                staged.size,
                staged.digest.hexdigest(),
                receiver.fields,
            )
        )
        receiver.discard()  # closes our descriptor; the name has moved already
        return result
    except ApiError:
        receiver.discard()
        await drain(iterator)
        raise
    except BaseException:
        receiver.discard()
        raise


@dataclass(frozen=True)
class StagedUpload:
    """A complete staged file and where it goes: what ``commit_staged`` moves into place
    (built by the form route and by the raw route alike)."""

    target: UploadTarget
    staged_name: str
    fd: int  # open on the staged file
    file_name: str  # the part's filename (or the target's ``name``)
    size: int
    sha256: str
    fields: dict[str, str]  # the form's: ``conversation_id``, ``subdir``, ``path``


async def commit_staged(upload: StagedUpload) -> UploadResult:
    """Move a complete staged file (``fd`` open on it) into its conversation's temparea,
    applying the form's ``fields`` (``conversation_id``, ``subdir``, ``path``) against the
    query's values and every limit under the conversation's lock. The caller discards the
    staged file afterwards (a no-op once it moved) and on any error."""
    target, fields = upload.target, upload.fields
    workspace, limits, quota = target.workspace, target.limits, target.quota
    file_name, size, fd = upload.file_name, upload.size, upload.fd
    cid = _pick("conversation_id", fields.get("conversation_id"), target.conversation_id)
    if cid is None:
        raise BadRequest("conversation_id is required (form field or query parameter)")
    cid = workspace.check_conversation_id(cid)
    workspace.check_subdir(_pick("subdir", fields.get("subdir"), target.subdir))
    if (path := fields.get("path")) is not None:  # seed 003's name for it
        named = workspace.check_file_name(path)
        if target.name is not None and named != target.name:
            raise BadRequest("path in the form and the name parameter disagree")
        limits.check_type(named)
        file_name = named
    await anyio.to_thread.run_sync(os.fsync, fd)
    async with target.locks.get(cid):
        # Checked again in commit_upload, synchronously with the rename: a deletion
        # that starts while we waited for the lock still wins.
        workspace.refuse_if_deleting(cid)
        if quota is not None:
            room = await quota.room(workspace, cid, file_name)
            if size > room:
                raise quota.refuse(size, room)
        replaced = workspace.has_upload(cid, file_name)
        if not replaced and workspace.count_uploads(cid) >= limits.max_file_count:
            raise Conflict(
                f"conversation '{cid}' already has {limits.max_file_count} files, the "
                "limit; delete one first",
                code="file_count_exceeded",
            )
        info = workspace.commit_upload(upload.staged_name, fd, cid, file_name, size, upload.sha256)
        return UploadResult(**info.model_dump(), replaced=replaced)


async def _check_room(
    receiver: _Receiver, quota: ConversationQuota, ws: Workspace, from_query: str | None
) -> None:
    """Measure the room once the file streams and its conversation is known; refuse as
    soon as the file outgrows it."""
    staged = receiver.staged
    assert staged is not None and receiver.file_name is not None
    if receiver.room is None:
        cid = _pick("conversation_id", receiver.fields.get("conversation_id"), from_query)
        if cid is None:
            return  # named after the file: checked before the rename
        cid = ws.check_conversation_id(cid)
        receiver.room = await quota.room(ws, cid, receiver.file_name)
    if staged.size > receiver.room:
        raise quota.refuse(staged.size, receiver.room)


def html5_unescape(name: str) -> str:
    # Browsers (HTML5 form encoding) and httpx send '"', CR and LF in multipart filenames
    # as %22, %0D and %0A; undo exactly that (CR/LF are then refused as control chars).
    return name.replace("%22", '"').replace("%0D", "\r").replace("%0A", "\n")


# The small form fields an upload route reads (the runtime: the first three; the API's
# raw-upload form: all four); any other field is ignored.
READ_FIELDS = frozenset({"conversation_id", "subdir", "path", "description"})


def repeated_field_message(field: str) -> str:
    """What every upload route answers (400) to a small form field sent more than once."""
    return f"form field '{field}' was sent more than once; send each field once"


def _pick(what: str, from_form: str | None, from_query: str | None) -> str | None:
    if from_form is not None and from_query is not None and from_form != from_query:
        raise BadRequest(f"{what} in the form and in the query disagree")
    return from_form if from_form is not None else from_query


async def drain(iterator: AsyncIterator[bytes]) -> None:
    drained = 0
    try:
        async for chunk in iterator:
            drained += len(chunk)
            if drained > _MAX_DRAIN_BYTES:
                return
    except Exception:  # the client went away: nothing more to drain
        return
