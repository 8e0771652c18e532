"""Raw uploads: a file's bytes and then a trailer — how the API forwards an upload whose
multipart form it has already parsed (store mode), so that the runtime neither parses the
form again nor hashes the bytes a second time (``python -m bench storage``: the runtime's
share of an upload's CPU was a quarter SHA-256 and a sixth multipart parsing).

Contract of ``receive_raw_upload``:
- The body is the file's bytes, then a JSON trailer (``Trailer``: the form's small fields,
  the file's size and SHA-256), then the trailer's length as ``LENGTH_BYTES`` bytes,
  big-endian. ``encode_trailer`` makes the last two.
- The file's name is known before its first byte (``name``, else ``filename``: the form's
  file name), so the type limit refuses before anything is written, as for a form.
- The bytes go to a staging file as they arrive. The size limit and the conversation's
  quota are checked on every chunk with the trailer's room as slack, and exactly once the
  trailer is cut off.
- A trailer that is missing, longer than ``MAX_TRAILER``, not the model, or whose size
  disagrees with the bytes received is a 400, and nothing is committed.
- Then the fields count as a form's do (``uploads.commit_staged``).
- The trailer's SHA-256 is recorded as the file's checksum: the API computed it over the
  bytes it sent, and the API is the runtime's only authenticated client.
- Any refusal deletes the staging file; the body is drained a while, as for a form.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator

from pydantic import BaseModel, Field, ValidationError

from sandbox_workspace.contract.errors import ApiError, BadRequest, TooLarge

from .schemas import UploadResult
from .uploads import StagedUpload, UploadLimits, UploadTarget, commit_staged, drain
from .workspace import Workspace

FEATURE = "raw_upload"  # in the runtime's /healthz features
MAX_TRAILER = 64 * 1024
LENGTH_BYTES = 8
_SLACK = MAX_TRAILER + LENGTH_BYTES


class Trailer(BaseModel):
    """What follows a raw upload's bytes."""

    fields: dict[str, str] = Field(default_factory=dict)  # the form's, the last of each name
    size: int = Field(ge=0)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")


def encode_trailer(trailer: Trailer) -> bytes:
    """The trailer and its length, to send after the file's bytes."""
    raw = trailer.model_dump_json().encode()
    if len(raw) > MAX_TRAILER:
        raise BadRequest(
            f"the upload's form fields take {len(raw)} bytes; at most {MAX_TRAILER} are taken",
            code="invalid_form_field",
        )
    return raw + len(raw).to_bytes(LENGTH_BYTES, "big")


async def receive_raw_upload(
    body: AsyncIterator[bytes], target: UploadTarget, *, filename: str | None
) -> UploadResult:
    """Stream one raw upload into a conversation's temparea; see the module contract."""
    workspace, limits, quota = target.workspace, target.limits, target.quota
    conversation_id, name = target.conversation_id, target.name
    if not filename and name is None:
        raise BadRequest("the 'file' field must carry a filename")
    file_name = workspace.check_file_name(name or filename or "")
    limits.check_type(file_name)
    cid = workspace.check_conversation_id(conversation_id) if conversation_id else None
    staged, fd = workspace.staging.new_file()
    iterator = aiter(body)
    try:
        received, room = 0, None
        async for chunk in iterator:
            received += len(chunk)
            if received > limits.max_file_size + _SLACK:
                raise _too_large(limits)
            if quota is not None and cid is not None:
                if room is None:
                    room = await quota.room(workspace, cid, file_name)
                if received - _SLACK > room:
                    raise quota.refuse(received - _SLACK, room)
            view = memoryview(chunk)
            while view:
                view = view[os.write(fd, view) :]
        trailer = _cut_trailer(fd, received)
        if trailer.size > limits.max_file_size:
            raise _too_large(limits)
        file = StagedUpload(target, staged, fd, file_name, trailer.size, trailer.sha256,
                            trailer.fields)  # fmt: skip
        result = await commit_staged(file)
        os.close(fd)
        return result
    except ApiError:
        _discard(workspace, staged, fd)
        await drain(iterator)
        raise
    except BaseException:
        _discard(workspace, staged, fd)
        raise


def _cut_trailer(fd: int, received: int) -> Trailer:
    """Read the trailer back from the end of the staged bytes and cut it off."""
    if received < LENGTH_BYTES:
        raise BadRequest("the raw upload ended before its trailer")
    length = int.from_bytes(os.pread(fd, LENGTH_BYTES, received - LENGTH_BYTES), "big")
    if length > MAX_TRAILER or length + LENGTH_BYTES > received:
        raise BadRequest(f"the raw upload's trailer length {length} is not possible")
    size = received - LENGTH_BYTES - length
    raw = os.pread(fd, length, size)
    os.ftruncate(fd, size)
    try:
        trailer = Trailer.model_validate_json(raw)
    except ValidationError as e:
        raise BadRequest(f"the raw upload's trailer is not valid: {e.errors()[0]['msg']}") from e
    if trailer.size != size:
        raise BadRequest(
            f"the raw upload's trailer says {trailer.size} bytes; {size} came before it"
        )
    return trailer


def _too_large(limits: UploadLimits) -> TooLarge:
    return TooLarge(f"file is larger than the limit of {limits.max_file_size} bytes")


def _discard(workspace: Workspace, staged: str, fd: int) -> None:
    os.close(fd)
    workspace.staging.discard(staged)
