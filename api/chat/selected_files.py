"""The one request model for selected files, shared by every chat route.

Contract: ``/chat``, ``/ui/chat``, ``/ag-ui`` (``forwardedProps.selected_files``) and
``/agents`` accept the same list — bare upload names (``data.csv``), full sandbox paths
(``{workspace}/{conversation_id}/uploads/temparea/data.csv``) and seed 000 §7's objects
(``{"file_name": …}`` holding either) — with the same checks and the same errors:
- a malformed list or item (not a list, a number, an object without ``file_name``, more
  than ``MAX_SELECTED`` items) is a 422 ``invalid_request`` naming the field;
- a name or path that is not this conversation's temparea (another conversation,
  outputs/, ``..``, ``/etc/passwd``, a name the path rules refuse) is a 400
  ``invalid_selected_file`` saying why;
- a well-formed name that is not an upload of this conversation (no session yet, or a
  running session's conversation has no such upload: ``routes/chat.py``'s
  ``refuse_unknown_selected``) is a 404 ``file_not_found`` before any stream; only while
  the sandbox is still starting does the run check it, failing with ``error``
  ``file_not_found``.
``selected_names`` does the 400/404 part and returns the upload names. ``history_names``
checks an earlier turn's own selection (seed 000 §7.4) the same way, except that its
files need not exist any more: the turn is rebuilt as it was.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from sandbox_workspace.contract.errors import BadRequest, NotFoundError

from ..file_refs import parse_file_ref
from ..names import name_schema

MAX_SELECTED = 100
_FILE_NAME = {k: v for k, v in name_schema("x").items() if k != "description"}


class SelectedFile(BaseModel):
    model_config = ConfigDict(strict=True)  # JSON types as documented: no "1" for 1

    file_name: str = Field(
        description="A name in temparea, or — not covered by the pattern — its full sandbox "
        "path `{workspace}/{conversation_id}/uploads/temparea/{name}`.",
        json_schema_extra=_FILE_NAME,
    )


SelectedFileRef = SelectedFile | Annotated[str, Field(json_schema_extra=_FILE_NAME)]
SELECTED_FILES_DESCRIPTION = (
    "Uploads of this conversation to put in the model's context (seed 000 §7.2): names, "
    'full sandbox paths, or objects `{"file_name": …}` holding either.'
)


def selected_files_field() -> Any:
    """The ``selected_files`` field of every chat request model."""
    return Field(
        default_factory=list,
        max_length=MAX_SELECTED,
        strict=True,
        description=SELECTED_FILES_DESCRIPTION,
    )


_LIST = TypeAdapter(list[SelectedFileRef])


def parse_selected(value: Any, loc: tuple[str, ...]) -> list[SelectedFileRef]:
    """Validate a list that arrived outside a request model (AG-UI's ``forwardedProps``)
    exactly as the models do: the same 422, located at ``loc``."""
    if value is None:
        return []
    try:
        refs = _LIST.validate_python(value, strict=True)
    except ValidationError as e:
        raise RequestValidationError(
            [{**err, "loc": (*loc, *err["loc"])} for err in e.errors()]
        ) from e
    if len(refs) > MAX_SELECTED:
        raise RequestValidationError(
            [
                {
                    "type": "too_long",
                    "loc": loc,
                    "msg": f"List should have at most {MAX_SELECTED} items after validation, "
                    f"not {len(refs)}",
                    "input": None,
                }
            ]
        )
    return refs


def refs_of(selected: list[SelectedFileRef]) -> list[str]:
    return [s.file_name if isinstance(s, SelectedFile) else s for s in selected]


def selected_names(
    cid: str, workspace_path: str | None, selected: list[SelectedFileRef]
) -> list[str]:
    """The upload names the selection names (``workspace_path`` None: no session yet)."""
    refs = refs_of(selected)
    if not refs:
        return []
    if workspace_path is None:
        # No session yet, so no uploads: a path can name nothing in this conversation's
        # temparea (400, like any misplaced path); a bare name is simply not there (404).
        for ref in refs:
            if "/" in ref:
                raise BadRequest(
                    f"selected file '{ref}' is not in this conversation's temparea",
                    code="invalid_selected_file",
                )
        raise NotFoundError(
            f"selected file '{refs[0]}' not found: this user has no session, so no uploads yet",
            code="file_not_found",
        )
    names = []
    for ref in refs:
        try:
            parsed = parse_file_ref(ref, cid, workspace_path)
        except BadRequest as e:
            raise BadRequest(
                f"selected file '{ref}' is not in this conversation's temparea: {e.message}",
                code="invalid_selected_file",
            ) from e
        if parsed.conversation_id != cid or parsed.area != "uploads":
            raise BadRequest(
                f"selected file '{ref}' is not in this conversation's temparea",
                code="invalid_selected_file",
            )
        names.append(parsed.name)
    return names


def history_names(
    cid: str, workspace_path: str | None, selected: list[SelectedFileRef], index: int
) -> list[str]:
    """The upload names of ``history[index]``'s selection (400 as ``selected_names``)."""
    refs = refs_of(selected)
    try:
        if workspace_path is not None:
            return selected_names(cid, workspace_path, selected)
        # No session: names are checked by the path rules; a path can name nothing here.
        for ref in refs:
            if "/" in ref:
                raise BadRequest(
                    f"selected file '{ref}' is not in this conversation's temparea",
                    code="invalid_selected_file",
                )
        return [parse_file_ref(ref, cid, "/").name for ref in refs]
    except BadRequest as e:
        raise BadRequest(f"history[{index}]: {e.message}", code="invalid_selected_file") from e
