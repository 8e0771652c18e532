"""Agent outputs: what code wrote under ``{conversation}/outputs/``.

Contract: listing walks outputs/ iteratively without following symlinks, bounded by
``limit`` files and ten times as many entries visited (``truncated`` says so);
opening a file resolves its relative path component by component through the same
path-safety rules as uploads, so a symlink planted there is refused, never followed.
These files are the agent's, never shown as user uploads; the chat's ``present_file``
offers them for download. ``write_output`` puts a file back at its path (the store's
fill of a new pod): the same checks, at most ``MAX_OUTPUT_DEPTH`` components and
``MAX_OUTPUT_PATH_BYTES``, the file size limit of uploads; bytes land in staging and are
renamed in whole beneath directory descriptors (a symlink on the way is refused, one at
the final name is replaced, never followed). ``delete_output`` removes one (the store's
delete by file_id reaching the sandbox's cache copy): the same checks, the entry
unlinked beneath its directory's descriptor, a missing one is ``NotFoundError``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import UTC, datetime

from sandbox_workspace.contract.errors import BadRequest, Conflict, NotFoundError, TooLarge

from . import pathsafe
from .marks import ConversationMarks
from .schemas import DEFAULT_OUTPUTS_LISTED, OutputFile, OutputList
from .upload_files import guess_mime
from .workspace import Workspace

OUTPUTS = "outputs"
_ENTRIES_PER_FILE = 10
MAX_OUTPUT_DEPTH = 32  # components below outputs/ a written file may have
MAX_OUTPUT_PATH_BYTES = 1024


@dataclass(frozen=True)
class OpenedOutput:
    fd: int
    size: int
    name: str
    path: str
    mime_type: str


def output_file(
    ws: Workspace,
    cid: str,
    parts: list[str],
    st: os.stat_result,
    marks: ConversationMarks | None = None,
) -> OutputFile:
    """The wire model of the output at ``parts`` (the one mapping of an output's stat and
    its runs' marks to it)."""
    path = ws.visible(cid, OUTPUTS, *parts)
    return OutputFile(
        relative_path="/".join(parts),
        path=path,
        size=st.st_size,
        modified_at=datetime.fromtimestamp(st.st_mtime, UTC),
        mime_type=guess_mime(parts[-1]),
        modified=marks is not None and path in marks.modified,
        presented=marks is not None and path in marks.presented,
    )


def list_outputs(
    ws: Workspace, conversation_id: str, limit: int = DEFAULT_OUTPUTS_LISTED
) -> OutputList:
    cid = ws.check_conversation_id(conversation_id)
    files: list[OutputFile] = []
    truncated = False
    marks = ws.marks.get(cid)
    # Entries visited are bounded too: a directory of a million empty subdirectories
    # holds no file but must not cost a million stats per listing.
    with ws.walk([cid, OUTPUTS], max_entries=limit * _ENTRIES_PER_FILE) as walk:
        for rel, st in walk:
            if len(files) >= limit:
                truncated = True
                break
            files.append(output_file(ws, cid, rel, st, marks))
        truncated = truncated or not walk.complete
    return OutputList(
        conversation_id=cid, path=ws.visible(cid, OUTPUTS), files=files, truncated=truncated
    )


def open_output(ws: Workspace, conversation_id: str, relative_path: str) -> OpenedOutput:
    cid = ws.check_conversation_id(conversation_id)
    try:
        parts = pathsafe.split_relative(relative_path, what="output path")
        fd = ws.root.open_file([cid, OUTPUTS, *parts])
    except pathsafe.UnsafePath as e:
        raise BadRequest(str(e), code="invalid_path") from e
    except pathsafe.NotFound as e:
        raise NotFoundError(f"no output '{relative_path}' in conversation '{cid}'") from e
    return OpenedOutput(
        fd=fd,
        size=os.fstat(fd).st_size,
        name=parts[-1],
        path=ws.visible(cid, OUTPUTS, *parts),
        mime_type=guess_mime(parts[-1]),
    )


def _output_parts(relative_path: str) -> list[str]:
    try:
        parts = pathsafe.split_relative(relative_path, what="output path")
    except pathsafe.UnsafePath as e:
        raise BadRequest(str(e), code="invalid_path") from e
    if len(parts) > MAX_OUTPUT_DEPTH or len(relative_path.encode()) > MAX_OUTPUT_PATH_BYTES:
        raise BadRequest(
            f"output path is deeper than {MAX_OUTPUT_DEPTH} components or longer than "
            f"{MAX_OUTPUT_PATH_BYTES} bytes",
            code="invalid_path",
        )
    return parts


async def write_output(
    ws: Workspace, conversation_id: str, relative_path: str, body, max_size: int
) -> OutputFile:
    """Stream ``body`` into ``outputs/{relative_path}`` (replacing a file there)."""
    cid = ws.check_conversation_id(conversation_id)
    parts = _output_parts(relative_path)
    ws.refuse_if_deleting(cid)
    ws.ensure_layout(cid)
    name, fd = ws.staging.new_file()
    try:
        size = 0
        async for chunk in body:
            size += len(chunk)
            if size > max_size:
                raise TooLarge(f"file is larger than the limit of {max_size} bytes")
            view = memoryview(chunk)
            while view:
                view = view[os.write(fd, view) :]
        os.fsync(fd)
        ws.refuse_if_deleting(cid)
        try:
            with ws.root.directory([cid, OUTPUTS, *parts[:-1]], create=True) as dfd:
                st = ws.staging.move_into(name, fd, dfd, parts[-1])
        except pathsafe.UnsafePath as e:
            raise BadRequest(str(e), code="invalid_path") from e
        except (pathsafe.NotFound, IsADirectoryError, NotADirectoryError) as e:
            raise Conflict(
                f"output path '{relative_path}' is blocked by a file or directory",
                code="path_conflict",
            ) from e
    except BaseException:
        ws.staging.discard(name)
        raise
    finally:
        os.close(fd)
    return output_file(ws, cid, parts, st)


def delete_output(ws: Workspace, conversation_id: str, relative_path: str) -> None:
    """Unlink ``outputs/{relative_path}`` (a file or a link, never followed)."""
    cid = ws.check_conversation_id(conversation_id)
    parts = _output_parts(relative_path)
    try:
        with ws.root.directory([cid, OUTPUTS, *parts[:-1]]) as dfd:
            os.unlink(parts[-1], dir_fd=dfd)
    except pathsafe.UnsafePath as e:
        raise BadRequest(str(e), code="invalid_path") from e
    except (pathsafe.NotFound, FileNotFoundError, NotADirectoryError) as e:
        raise NotFoundError(f"no output '{relative_path}'") from e
    except IsADirectoryError as e:
        raise Conflict(f"output '{relative_path}' is a directory", code="path_conflict") from e
