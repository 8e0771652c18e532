"""Agent outputs: what code wrote under ``{conversation}/outputs/``.

Contract: listing walks outputs/ iteratively without following symlinks, bounded by
``limit`` files and ten times as many entries visited (``truncated`` says so);
opening a file resolves its relative path component by component through the same
path-safety rules as uploads, so a symlink planted there is refused, never followed.
These files are the agent's, never shown as user uploads; the chat's ``present_file``
offers them for download.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import UTC, datetime

from . import pathsafe
from .errors import BadRequest, NotFoundError
from .schemas import OutputFile, OutputList
from .upload_files import guess_mime
from .workspace import Workspace

OUTPUTS = "outputs"
_ENTRIES_PER_FILE = 10


@dataclass(frozen=True)
class OpenedOutput:
    fd: int
    size: int
    name: str
    path: str
    mime_type: str


def list_outputs(ws: Workspace, conversation_id: str, limit: int = 2000) -> OutputList:
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
            path = ws.visible(cid, OUTPUTS, *rel)
            files.append(
                OutputFile(
                    relative_path="/".join(rel),
                    path=path,
                    size=st.st_size,
                    modified_at=datetime.fromtimestamp(st.st_mtime, UTC),
                    mime_type=guess_mime(rel[-1]),
                    modified=path in marks.modified,
                    presented=path in marks.presented,
                )
            )
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
