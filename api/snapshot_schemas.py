"""Request and answer bodies of the snapshot and fork routes (``routes.snapshots``), kept
apart from ``schemas`` (the file vocabulary) so each changes on its own."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema

from .names import conversation_id_schema

SNAPSHOT_ID_PATTERN = "^[0-9a-f]{32}$"  # made by the server (``store.snapshots.new_id``)


class SnapshotRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field("", max_length=200, description="A label of your choice (e.g. `turn 3`).")


class SnapshotInfo(BaseModel):
    snapshot_id: str = Field(description="Made by the server; names the snapshot in its routes.")
    conversation_id: str
    name: str
    created_at: str = Field(description="When it was taken (ISO 8601, UTC).")
    file_count: int
    bytes: int = Field(description="The bytes of its files (counted in the user's quota).")
    state: Literal["last_write_back", "live"] = Field(
        description="Which files it holds: `last_write_back` (s3 store mode: the store's "
        "files as last written back, taken after any write-back in progress — what a "
        "running execution has not written back yet is not in it) or `live` (local mode: "
        "the workspace's files at that instant)."
    )


class SnapshotList(BaseModel):
    snapshots: list[SnapshotInfo]


class Restored(SnapshotInfo):
    kernel_restarted: bool = Field(
        True,
        description="Always true: the Python state is not in a snapshot; the conversation's "
        "processes were stopped and the next execution starts a new interpreter.",
    )
    note: str


class ForkRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    conversation_id: Annotated[str, WithJsonSchema(conversation_id_schema())] | None = Field(
        None, description="The new conversation's id (it must not exist); without it, one is made."
    )
    snapshot_id: Annotated[str, Field(pattern=SNAPSHOT_ID_PATTERN)] | None = Field(
        None, description="Fork from this snapshot of the conversation instead."
    )


class Forked(BaseModel):
    conversation_id: str = Field(description="The new conversation (same session).")
    forked_from: str
    snapshot_id: str | None
    file_count: int
    bytes: int
