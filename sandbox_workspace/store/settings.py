"""Store settings, shared by the API's and the operator's settings objects.

``SANDBOX_WORKSPACE_STORE=local|s3`` chooses the mode once at start: ``local`` keeps files
only in the sandboxes' workspaces (the behaviour before the store existed); ``s3`` makes an
S3-compatible bucket their source of truth. The ``s3`` group is read from
``SANDBOX_WORKSPACE_S3__*`` (pydantic-settings' nested delimiter); credentials not given
there come from the standard AWS variables and credential chain (``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``, web identity, instance metadata).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, SecretStr, field_validator

StoreMode = Literal["local", "s3"]
ENV = "SANDBOX_WORKSPACE_S3__"


class S3Settings(BaseModel):
    endpoint_url: str | None = Field(
        None, description="S3 endpoint, e.g. http://seaweedfs:8333 (unset: AWS by region)."
    )
    bucket: str | None = Field(None, description="The bucket (must exist; required for s3).")
    prefix: str = Field("workspaces/", description="Key prefix of every workspace object.")
    region: str = Field("us-east-1", description="Signing region.")
    access_key_id: SecretStr | None = Field(None, description="Else AWS_ACCESS_KEY_ID / chain.")
    secret_access_key: SecretStr | None = Field(None, description="Else AWS_SECRET_ACCESS_KEY.")
    virtual_hosted_style: bool = Field(
        False, description="bucket.host addressing (AWS); path style suits other stores."
    )
    max_concurrency: int = Field(
        4, ge=1, le=32, description="Parts of one upload in flight (memory: × 8 MiB)."
    )
    plain_get: bool = Field(
        True,
        description="Downloads from an http:// endpoint read the socket directly (a "
        "presigned GET; less CPU than the S3 client); false: through the S3 client.",
    )
    versioned_bucket: Literal["refuse", "delete_versions"] = Field(
        "refuse",
        description="A bucket with versioning enabled (or suspended) keeps every deleted "
        "file's bytes as non-current versions: refuse to start (default), or delete every "
        "version under a deleted conversation's prefix (delete_versions).",
    )

    sign_payload: bool | None = Field(
        None,
        description="Sign each request's body (SigV4's payload hash: a SHA-256 of every "
        "byte, by the API and again by the store). Unset: signed over http://, not over "
        "https:// where TLS protects the body, as the AWS SDKs do. False on a trusted "
        "in-cluster network saves ~0.2 s of the API's CPU per 256 MB uploaded.",
    )

    def signs_payload(self) -> bool:
        if self.sign_payload is not None:
            return self.sign_payload
        return not (self.endpoint_url or "https://").startswith("https://")

    @field_validator("prefix")
    @classmethod
    def _prefix(cls, value: str) -> str:
        if value and not value.endswith("/"):
            value += "/"
        if value.startswith("/") or "//" in value:
            raise ValueError(f"{ENV}PREFIX must be a relative key prefix like 'workspaces/'")
        return value
