"""How clients name files: a bare name plus a conversation, or a full sandbox path.

Contract: ``parse_file_ref`` turns either form into a ``FileRef`` whose every component
has passed the runtime's path-safety rules, or raises ``BadRequest`` saying which shape
is expected. Full paths must start with the session's workspace path and have the shape
``{workspace}/{conversation_id}/uploads/temparea/{name}`` (user uploads) or — where
allowed — ``{workspace}/{conversation_id}/outputs/{relative path}`` (agent outputs). A
conversation given beside a full path must be the path's own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from sandbox_workspace.contract import ids
from sandbox_workspace.contract.errors import BadRequest
from sandbox_workspace.runtime.schemas import UPLOAD_SUBDIR

Area = Literal["uploads", "outputs"]


@dataclass(frozen=True)
class FileRef:
    conversation_id: str
    area: Area
    parts: tuple[str, ...]

    @property
    def name(self) -> str:
        return self.parts[-1]


def parse_file_ref(
    ref: str, conversation_id: str | None, workspace_path: str, *, allow_outputs: bool = False
) -> FileRef:
    if "/" not in ref:
        if conversation_id is None:
            raise BadRequest(
                "conversation_id is required to address a file by name",
                code="missing_conversation_id",
            )
        return FileRef(
            ids.conversation_id_or_400(conversation_id),
            "uploads",
            (ids.file_name_or_400(ref),),
        )
    root = workspace_path.rstrip("/")
    shapes = f"{root}/{{conversation_id}}/uploads/temparea/{{name}}"
    if allow_outputs:
        shapes += f" or {root}/{{conversation_id}}/outputs/{{path}}"
    path = "/" + ref.lstrip("/")
    if not path.startswith(root + "/"):
        raise BadRequest(f"a file path must look like {shapes}", code="invalid_path")
    parts = path[len(root) + 1 :].split("/")
    if len(parts) == 4 and parts[1:3] == ["uploads", UPLOAD_SUBDIR]:
        area: Area = "uploads"
        rest = parts[3:]
    elif allow_outputs and len(parts) >= 3 and parts[1] == "outputs":
        area = "outputs"
        rest = parts[2:]
    else:
        raise BadRequest(f"a file path must look like {shapes}", code="invalid_path")
    if conversation_id is not None and conversation_id != parts[0]:
        raise BadRequest(
            "the path's conversation differs from conversation_id", code="conversation_mismatch"
        )
    try:
        checked = tuple(ids.check_name(p, what="path component") for p in rest)
    except ids.UnsafePath as e:
        raise BadRequest(str(e), code="invalid_file_name") from e
    return FileRef(ids.conversation_id_or_400(parts[0]), area, checked)
