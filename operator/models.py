"""Typed models of the custom resources' contents (the CRD schema is generated from these).

Only the parts the API already needs live here so far; the operator issue completes them.
Field names are camelCase on the wire (Kubernetes convention) and snake_case in Python;
``populate_by_name`` lets the API accept the seed's snake_case JSON as well.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic.alias_generators import to_camel

SizeUnit = Literal["B", "KB", "MB", "GB"]
_UNIT_BYTES = {"B": 1, "KB": 1024, "MB": 1024**2, "GB": 1024**3}

# seed 000 §5.2 defaults
DEFAULT_ALLOWED_FILE_TYPES = ("csv", "xlsx", "json", "txt", "pkl", "png", "jpg", "pdf")


class CamelModel(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")


class FileUploadConfig(CamelModel):
    """Upload limits of one session (seed 000 §5)."""

    max_file_size: int = Field(
        100, ge=1, description="Largest accepted file, in `maxFileSizeUnit`."
    )
    max_file_size_unit: SizeUnit = Field(
        "MB", description="Unit of `maxFileSize`: B, KB, MB or GB."
    )
    max_file_count: int = Field(50, ge=1, le=100_000, description="Most uploads per conversation.")
    allowed_file_types: list[str] = Field(
        default_factory=lambda: list(DEFAULT_ALLOWED_FILE_TYPES),
        description="Accepted file extensions without the dot; empty accepts every type.",
    )

    @field_validator("max_file_size_unit", mode="before")
    @classmethod
    def _upper_unit(cls, value: object) -> object:
        return value.upper() if isinstance(value, str) else value

    @field_validator("allowed_file_types")
    @classmethod
    def _normalise_types(cls, value: list[str]) -> list[str]:
        out = []
        for item in value:
            ext = item.strip().lower().lstrip(".")
            if not ext or not ext.isascii() or not all(c.isalnum() or c in "-_+" for c in ext):
                raise ValueError(f"'{item}' is not a file extension (letters/digits, e.g. 'csv')")
            out.append(ext)
        return out

    @property
    def max_file_size_bytes(self) -> int:
        return self.max_file_size * _UNIT_BYTES[self.max_file_size_unit]
