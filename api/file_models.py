"""The public file vocabulary: the API's models of a file, and the one mapping from each
internal shape to them.

Contract:
- The models stand on their own (no runtime or store model is a base class): what a client
  reads changes only here, whatever the runtime or the store adds.
- Each internal shape has one mapping, below the models: the runtime's wire models
  (``runtime/schemas``: ``UploadedFile``, ``UploadResult``, ``UploadList``,
  ``OutputFile``) and the store's record (``store/manifest.FileRecord``). Routes and
  services call these and build no file model themselves.
- Adding a field to a file, in the API: the field on its model here and its line in the
  mapping here (tests/unit/test_file_models.py fails while a public field is not mapped).
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field

from sandbox_workspace.runtime.schemas import (
    UPLOAD_SUBDIR,
    OutputFile,
    UploadedFile,
    UploadList,
    UploadResult,
)
from sandbox_workspace.store.manifest import FileRecord

Source = Literal["user_upload", "ai_created", "ai_modified"]


class FileItem(BaseModel):
    """One user upload of a listing (seed 001 §5.2's size and time, its digest and type)."""

    name: str
    path: str = Field(description="Full path as code in the sandbox opens it.")
    size: int
    sha256: str
    mime_type: str
    uploaded_at: datetime
    conversation_id: str = Field(description="Its conversation (names repeat across them).")
    subdir: str = UPLOAD_SUBDIR
    modified: bool = Field(
        False,
        description="True when executed code changed the file after the upload (its bytes "
        "or its inode: write, chmod, link): size is the current one, sha256 the uploaded "
        "bytes' digest.",
    )
    presented: bool = Field(False, description="A run presented this file to the user.")


class FileUploaded(FileItem):
    """The upload answer: the file, with seed 000 §8.6's ``file_name``."""

    session_id: str
    file_name: str = Field(description="The file's name, as `selected_files` names it.")
    replaced: bool = Field(False, description="True when a file of that name was overwritten.")


class SessionFileList(BaseModel):
    """Uploads of every conversation of the session: ``files`` their names, as seed 000
    §6.3's frontend reads them, ``items`` the files (each names its conversation)."""

    session_id: str
    files: list[str] = Field(description='The files\' names (`["data.csv", …]`).')
    items: list[FileItem] = Field(description="The files, in the order of `files`.")


class FileList(SessionFileList):
    """Uploads of one conversation (``files`` names, ``items`` the files)."""

    conversation_id: str
    subdir: str = UPLOAD_SUBDIR
    path: str = Field(description="The temparea directory as code in the sandbox sees it.")


class FileDeleted(BaseModel):
    session_id: str
    conversation_id: str
    name: str
    deleted: bool = True


class WorkspaceFile(BaseModel):
    """One file of a conversation: a user upload, or a file the agent wrote under outputs/."""

    name: str = Field(description="File name (uploads) or path below outputs/ (outputs).")
    path: str = Field(description="Full path as code in the sandbox opens it.")
    size: int
    mime_type: str
    modified_at: datetime = Field(description="Upload time for uploads.")
    source: Source = Field(
        description="`user_upload`; `ai_modified` when a run changed a file that existed "
        "before it, else `ai_created` (as seen by this API process; see docs/api.md)."
    )
    is_presented: bool = Field(description="The agent offered it to the user (present_file).")
    sha256: str | None = Field(None, description="Uploads only.")


class StoredFile(BaseModel):
    """Seed 003's record of one file of a conversation (``conversation_files``)."""

    file_id: str = Field(description="UUID; stays with the file across versions.")
    conversation_id: str
    file_path: str = Field(description="Relative to the conversation's directory.")
    original_name: str
    file_size: int
    mime_type: str
    version: int = Field(description="1 when created, +1 on every change.")
    source: Source
    is_presented: bool = Field(description="The agent offered it to the user (present_file).")
    checksum: str = Field(description="SHA-256 of the bytes, hex.")
    status: Literal["active", "deleted"]
    description: str
    created_at: datetime
    updated_at: datetime


# -- the mappings: one per internal shape -----------------------------------------------


def file_item(f: UploadedFile) -> FileItem:
    """An upload, from the runtime's wire model."""
    return FileItem(
        name=f.name,
        path=f.path,
        size=f.size,
        sha256=f.sha256,
        mime_type=f.mime_type,
        uploaded_at=f.uploaded_at,
        conversation_id=f.conversation_id,
        subdir=f.subdir,
        modified=f.modified,
        presented=f.presented,
    )


def file_uploaded(f: UploadResult, session_id: str) -> FileUploaded:
    """The upload answer, from the runtime's (or the store mode's) upload result."""
    item = dict(file_item(f))
    return FileUploaded(**item, session_id=session_id, file_name=f.name, replaced=f.replaced)


def session_file_list(session_id: str, uploads: list[UploadedFile]) -> SessionFileList:
    return SessionFileList(
        session_id=session_id,
        files=[f.name for f in uploads],
        items=[file_item(f) for f in uploads],
    )


def file_list(session_id: str, listing: UploadList) -> FileList:
    return FileList(
        session_id=session_id,
        files=[f.name for f in listing.files],
        items=[file_item(f) for f in listing.files],
        conversation_id=listing.conversation_id,
        subdir=listing.subdir,
        path=listing.path,
    )


def workspace_upload(f: UploadedFile) -> WorkspaceFile:
    """An upload in a conversation's state."""
    return WorkspaceFile(
        name=f.name,
        path=f.path,
        size=f.size,
        mime_type=f.mime_type,
        modified_at=f.uploaded_at,
        source="user_upload",
        is_presented=f.presented,
        sha256=f.sha256,
    )


def workspace_output(f: OutputFile) -> WorkspaceFile:
    """A file under outputs/ in a conversation's state."""
    return WorkspaceFile(
        name=f.relative_path,
        path=f.path,
        size=f.size,
        mime_type=f.mime_type,
        modified_at=f.modified_at,
        source="ai_modified" if f.modified else "ai_created",
        is_presented=f.presented,
    )


def stored_file(r: FileRecord) -> StoredFile:
    """Seed 003's record, from the store's."""
    return StoredFile(
        file_id=r.file_id,
        conversation_id=r.conversation_id,
        file_path=r.file_path,
        original_name=r.original_name,
        file_size=r.file_size,
        mime_type=r.mime_type,
        version=r.version,
        source=r.source,
        is_presented=r.is_presented,
        checksum=r.checksum,
        status=r.status,
        description=r.description,
        created_at=r.created_at,
        updated_at=r.updated_at,
    )
