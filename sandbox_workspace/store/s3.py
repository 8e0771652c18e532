"""``S3Store``: the object store interface over any S3-compatible service, with obstore.

Why obstore (Rust ``object_store`` behind a small Python API): uploads and downloads are
async streams handled off the event loop in Rust (no GIL-bound per-chunk signing or
parsing), multipart uploads of async iterables with bounded parts in flight
(``max_concurrency`` × 8 MiB is all an upload holds in memory), bulk DeleteObjects, and
conditional puts (If-None-Match / If-Match, ``conditional_put="etag"``) — what the
metadata's compare-and-swap needs. aiobotocore would add botocore's pure-Python signing
and XML parsing on every call; plain httpx would mean writing SigV4 and multipart here.

Configuration errors are found by ``check`` at start (one LIST of at most one key) and
named by the setting to change; afterwards every service failure is ``StoreUnavailable``.
"""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import AsyncIterator
from datetime import timedelta

import obstore
from obstore import exceptions as obx
from obstore.store import S3Store as _ObS3Store

from . import s3_get
from .base import (
    Body,
    Download,
    ObjectInfo,
    ObjectNotFound,
    PreconditionFailed,
    StoreConfigError,
    StoreUnavailable,
    check_key,
    check_prefix,
)
from .s3_admin import S3Admin
from .settings import ENV, S3Settings

log = logging.getLogger(__name__)
_PART = 8 * 1024 * 1024
_CHUNK = 1024 * 1024
_SETTLE = 0.05  # s: for the Rust runtime's last callbacks (``aclose``)


def _info(meta: dict) -> ObjectInfo:
    return ObjectInfo(
        key=meta["path"],
        size=meta["size"],
        etag=(meta.get("e_tag") or "").strip('"'),
        modified=meta["last_modified"],
    )


def _unavailable(e: Exception) -> StoreUnavailable:
    return StoreUnavailable(f"object store error: {e.__class__.__name__}: {str(e)[:300]}")


class _Download:
    def __init__(self, result: obstore.GetResult) -> None:
        self.info = _info(result.meta)
        self._stream = result.stream(min_chunk_size=_CHUNK)

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._stream:
                yield bytes(chunk)
        except obx.BaseError as e:
            raise _unavailable(e) from e

    async def aclose(self) -> None:
        return None  # the stream ends with its last chunk or with its GetResult


class S3Store:
    """Objects of one bucket (keys given whole; the prefix is the caller's layout)."""

    def __init__(self, settings: S3Settings) -> None:
        if not settings.bucket:
            raise StoreConfigError(f"SANDBOX_WORKSPACE_STORE=s3 needs {ENV}BUCKET")
        self.settings = settings
        endpoint = settings.endpoint_url or ""
        self._plain_get = settings.plain_get and endpoint.startswith("http://")
        config: dict = {
            "region": settings.region,
            "conditional_put": "etag",
            "virtual_hosted_style_request": settings.virtual_hosted_style,
            "unsigned_payload": not settings.signs_payload(),
        }
        if settings.endpoint_url:
            config["endpoint"] = settings.endpoint_url
        if settings.access_key_id is not None:
            config["access_key_id"] = settings.access_key_id.get_secret_value()
        if settings.secret_access_key is not None:
            config["secret_access_key"] = settings.secret_access_key.get_secret_value()
        self._store = _ObS3Store(
            settings.bucket,
            config=config,
            client_options={
                "allow_http": bool(settings.endpoint_url)
                and settings.endpoint_url.startswith("http://"),
                "connect_timeout": timedelta(seconds=5),
                # object_store's default of 30 s for a whole request would cut large files.
                "timeout": timedelta(hours=6),
            },
            retry_config={"max_retries": 3, "retry_timeout": timedelta(seconds=20)},
        )
        self.admin = S3Admin(settings)
        self.versioned = False  # known by ``check``

    async def check(self) -> None:
        s = self.settings
        try:
            stream = obstore.list(self._store, s.prefix or None, chunk_size=1)
            async for _ in stream:
                break
        except (obx.UnauthenticatedError, obx.PermissionDeniedError) as e:
            raise StoreConfigError(
                f"the object store refused the credentials for bucket {s.bucket!r}: check "
                f"{ENV}ACCESS_KEY_ID / {ENV}SECRET_ACCESS_KEY (or AWS_ACCESS_KEY_ID / "
                f"AWS_SECRET_ACCESS_KEY): {str(e)[:200]}"
            ) from e
        except obx.BaseError as e:
            text = str(e)
            # The status as obstore words it: a bare "404"/"403" would also match the
            # endpoint's port or a request id (port 40483 once read as "no such bucket").
            if "NoSuchBucket" in text or "status code: 404" in text:
                raise StoreConfigError(
                    f"bucket {s.bucket!r} does not exist at {s.endpoint_url or 'AWS'}: check "
                    f"{ENV}BUCKET (the bucket must be created beforehand)"
                ) from e
            refused = ("InvalidAccessKeyId", "SignatureDoesNotMatch", "status code: 403")
            if any(w in text for w in refused):
                raise StoreConfigError(
                    f"the object store refused the credentials for bucket {s.bucket!r}: "
                    f"check {ENV}ACCESS_KEY_ID / {ENV}SECRET_ACCESS_KEY (or the AWS_* "
                    f"variables): {text[:200]}"
                ) from e
            raise StoreConfigError(
                f"the object store at {s.endpoint_url or 'AWS'} cannot be used: check "
                f"{ENV}ENDPOINT_URL and {ENV}REGION: {text[:200]}"
            ) from e
        await self._check_leftovers()

    async def _check_leftovers(self) -> None:
        """What a plain listing misses (``s3_admin``): a versioned bucket is refused
        unless ``versioned_bucket=delete_versions``; without static keys nothing can be
        checked or cleaned, which is logged (the lifecycle rule is the fallback)."""
        s = self.settings
        if not self.admin.available:
            log.warning(
                "no static S3 keys: incomplete multipart uploads and object versions "
                "cannot be removed on deletion; set an AbortIncompleteMultipartUpload "
                "lifecycle rule on the bucket and keep versioning off (docs/operations.md)"
            )
            return
        try:
            status = await self.admin.versioning()
        except StoreUnavailable as e:
            raise StoreConfigError(
                f"could not read the versioning of bucket {s.bucket!r} (the API and the "
                f"operator need s3:GetBucketVersioning): {str(e)[:200]}"
            ) from e
        self.versioned = status in ("Enabled", "Suspended")
        if self.versioned and s.versioned_bucket == "refuse":
            raise StoreConfigError(
                f"bucket {s.bucket!r} has versioning {status}: a deleted conversation's "
                "files would stay as non-current versions. Use a bucket without "
                f"versioning, or set {ENV}VERSIONED_BUCKET=delete_versions to delete "
                "every version of a deleted conversation's objects"
            )

    async def put(
        self, key: str, body: Body, *, if_absent: bool = False, if_match: str | None = None
    ) -> str:
        check_key(key)
        mode: object = "overwrite"
        if if_absent:
            mode = "create"
        elif if_match is not None:
            mode = {"e_tag": f'"{if_match}"'}
        try:
            result = await obstore.put_async(
                self._store,
                key,
                body,
                mode=mode,  # type: ignore[arg-type]
                chunk_size=_PART,
                max_concurrency=self.settings.max_concurrency,
            )
        except (obx.AlreadyExistsError, obx.PreconditionError) as e:
            raise PreconditionFailed(f"object {key!r} changed meanwhile") from e
        except obx.BaseError as e:
            raise _unavailable(e) from e
        return (result["e_tag"] or "").strip('"')

    async def get(self, key: str) -> Download:
        check_key(key)
        if self._plain_get:
            try:
                signed = await obstore.sign_async(self._store, "GET", key, s3_get.SIGNED_FOR)
            except obx.BaseError as e:
                raise _unavailable(e) from e
            return await s3_get.open_get(signed, key)
        try:
            return _Download(await obstore.get_async(self._store, key))
        except (obx.NotFoundError, FileNotFoundError) as e:
            raise ObjectNotFound(f"no object {key!r}") from e
        except obx.BaseError as e:
            raise _unavailable(e) from e

    async def read(self, key: str) -> tuple[bytes, str]:
        check_key(key)
        try:
            result = await obstore.get_async(self._store, key)
            data = bytes(await result.bytes_async())
        except (obx.NotFoundError, FileNotFoundError) as e:
            raise ObjectNotFound(f"no object {key!r}") from e
        except obx.BaseError as e:
            raise _unavailable(e) from e
        return data, _info(result.meta).etag

    async def head(self, key: str) -> ObjectInfo | None:
        check_key(key)
        try:
            return _info(await obstore.head_async(self._store, key))
        except (obx.NotFoundError, FileNotFoundError):
            return None
        except obx.BaseError as e:
            raise _unavailable(e) from e

    async def list(self, prefix: str) -> AsyncIterator[ObjectInfo]:
        check_prefix(prefix)
        try:
            async for batch in obstore.list(self._store, prefix or None, chunk_size=1000):
                for meta in batch:
                    yield _info(meta)
        except obx.BaseError as e:
            raise _unavailable(e) from e

    async def copy(self, src: str, dst: str) -> None:
        check_key(src)
        check_key(dst)
        try:
            await obstore.copy_async(self._store, src, dst)
        except (obx.NotFoundError, FileNotFoundError) as e:
            raise ObjectNotFound(f"no object {src!r}") from e
        except obx.BaseError as e:
            raise _unavailable(e) from e

    async def delete(self, key: str) -> None:
        check_key(key)
        try:
            await obstore.delete_async(self._store, key)
        except (obx.NotFoundError, FileNotFoundError):
            return
        except obx.BaseError as e:
            raise _unavailable(e) from e

    async def delete_prefix(self, prefix: str) -> int:
        check_prefix(prefix)
        keys = [info.key async for info in self.list(prefix)]
        for start in range(0, len(keys), 1000):
            try:
                await obstore.delete_async(self._store, keys[start : start + 1000])
            except (obx.NotFoundError, FileNotFoundError):
                continue
            except obx.BaseError as e:
                raise _unavailable(e) from e
        await self._abort_uploads(prefix)
        left = sum([1 async for _ in self.list(prefix)])
        if self.versioned:
            left += await self._delete_versions(prefix)
        if self.admin.available:
            left += len(await self.admin.uploads(prefix))
        return left

    async def _abort_uploads(self, prefix: str) -> None:
        """Multipart uploads under ``prefix`` that were never completed — a process
        killed mid-upload — hold their parts until aborted (a listing never shows them)."""
        if self.admin.available:
            for key, upload_id in await self.admin.uploads(prefix):
                await self.admin.abort(key, upload_id)

    async def _delete_versions(self, prefix: str) -> int:
        """Every version and delete marker under ``prefix``; answer how many remain."""
        for key, version_id in await self.admin.versions(prefix):
            await self.admin.delete_version(key, version_id)
        return len(await self.admin.versions(prefix))

    async def aclose(self) -> None:
        """Let go of the client while the event loop still runs. obstore's calls complete
        on a Rust (tokio) thread that hands the result to the loop and then drops its
        Python references; one still doing that when ``asyncio.run`` returns and the
        interpreter finalises aborts the process (SIGABRT — seen in ~1 of 10 short-lived
        processes that refused a bucket). Dropping the client and yielding a moment lets
        those last callbacks land first; every process that opens a store closes it."""
        await self.admin.aclose()
        self._store = None  # type: ignore[assignment]
        gc.collect()
        await asyncio.sleep(_SETTLE)
