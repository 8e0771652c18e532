"""api/file_models.py: the public file vocabulary stands on its own, and each internal
shape's one mapping sets every public field (a field added to a model and forgotten in
its mapping fails here)."""

from __future__ import annotations

from dataclasses import astuple, dataclass
from datetime import UTC, datetime

import pytest
from pydantic import BaseModel

from sandbox_workspace.api import file_models as fm
from sandbox_workspace.runtime.metastore import UploadMeta
from sandbox_workspace.runtime.schemas import OutputFile, UploadedFile, UploadList, UploadResult
from sandbox_workspace.store.manifest import FileRecord

T = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
UPLOAD = UploadedFile(
    name="data.csv",
    path="/workspace/c1/uploads/temparea/data.csv",
    size=7,
    sha256="ab" * 32,
    mime_type="text/csv",
    uploaded_at=T,
    conversation_id="c1",
    subdir="temparea",
    modified=True,
    presented=True,
)
OUTPUT = OutputFile(
    relative_path="charts/a.png",
    path="/workspace/c1/outputs/charts/a.png",
    size=9,
    modified_at=T,
    mime_type="image/png",
    modified=True,
    presented=True,
)
RECORD = FileRecord(
    file_id="f-1",
    conversation_id="c1",
    file_path="uploads/temparea/data.csv",
    original_name="data.csv",
    file_size=7,
    mime_type="text/csv",
    version=3,
    source="ai_modified",
    is_presented=True,
    checksum="cd" * 32,
    status="active",
    description="the data",
    created_at=T.isoformat(),
    updated_at=T.isoformat(),
    etag="e",
)
PUBLIC = [
    fm.FileItem,
    fm.FileUploaded,
    fm.SessionFileList,
    fm.FileList,
    fm.FileDeleted,
    fm.WorkspaceFile,
    fm.StoredFile,
]


@pytest.mark.parametrize("model", PUBLIC, ids=lambda m: m.__name__)
def test_no_public_file_model_inherits_an_internal_one(model):
    for base in model.__mro__:
        if issubclass(base, BaseModel) and base is not BaseModel:
            assert base.__module__ == fm.__name__, (model, base)


def mapped() -> list[tuple[BaseModel, set[str]]]:
    """Each mapping's answer, with the fields its source may leave unset."""
    listing = UploadList(conversation_id="c1", subdir="temparea", path="/w/c1/t", files=[UPLOAD])
    return [
        (fm.file_item(UPLOAD), set()),
        (fm.file_uploaded(UploadResult(**UPLOAD.model_dump(), replaced=True), "s"), set()),
        (fm.session_file_list("s", [UPLOAD]), set()),
        (fm.file_list("s", listing), set()),
        (fm.workspace_upload(UPLOAD), set()),
        (fm.workspace_output(OUTPUT), {"sha256"}),  # uploads only
        (fm.stored_file(RECORD), set()),
    ]


def test_every_mapping_sets_every_public_field():
    for answer, optional in mapped():
        unset = set(type(answer).model_fields) - answer.model_fields_set - optional
        assert not unset, (type(answer).__name__, unset)


def test_the_mappings_carry_the_values():
    item = fm.file_item(UPLOAD)
    assert item.model_dump() == UPLOAD.model_dump()
    answer = fm.file_uploaded(UploadResult(**UPLOAD.model_dump(), replaced=True), "s")
    assert (answer.file_name, answer.replaced, answer.session_id) == ("data.csv", True, "s")
    assert fm.workspace_upload(UPLOAD).model_dump() == {
        "name": "data.csv",
        "path": UPLOAD.path,
        "size": 7,
        "mime_type": "text/csv",
        "modified_at": T,
        "source": "user_upload",
        "is_presented": True,
        "sha256": UPLOAD.sha256,
    }
    output = fm.workspace_output(OUTPUT)
    assert (output.name, output.source, output.is_presented) == (
        "charts/a.png",
        "ai_modified",
        True,
    )
    assert fm.workspace_output(OUTPUT.model_copy(update={"modified": False})).source == "ai_created"
    stored = fm.stored_file(RECORD).model_dump()
    assert stored == {**{k: getattr(RECORD, k) for k in stored}, "created_at": T, "updated_at": T}


@dataclass(frozen=True)
class LaterMeta(UploadMeta):
    """The runtime's record after a release added a field (with its default)."""

    pinned: bool = False


def test_an_upload_record_written_before_a_field_was_added_still_reads():
    before = UploadMeta("data.csv", 7, "ab" * 32, "text/csv", T.isoformat(), 1, 2, 3)
    assert LaterMeta.parse(before.to_bytes()) == LaterMeta(*astuple(before), pinned=False)
    assert LaterMeta.parse(LaterMeta(*astuple(before), pinned=True).to_bytes()).pinned
    # A field without a default is still required, and every type still exact.
    assert UploadMeta.parse(before.to_bytes().replace(b'"size":7,', b"")) is None
    assert LaterMeta.parse(before.to_bytes()[:-1] + b',"pinned":1}') is None
