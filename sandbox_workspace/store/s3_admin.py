"""What a plain listing does not show: incomplete multipart uploads and object versions.

A conversation's deletion must leave nothing in the bucket, and ``ListObjectsV2`` shows
neither the parts of a multipart upload whose process died (an API killed mid-upload: the
upload is never completed nor aborted) nor the non-current versions of a versioned bucket.
obstore has no call for either, so this module makes the few S3 requests needed, signed
with SigV4 here (``sign``; ~40 lines of a published algorithm, checked by every request
against SeaweedFS in tests/store), over httpx:

- ``uploads(prefix)`` / ``abort(key, upload_id)`` — ListMultipartUploads /
  AbortMultipartUpload;
- ``versioning()`` — GetBucketVersioning: ``""`` (never enabled), ``Enabled`` or
  ``Suspended``;
- ``versions(prefix)`` / ``delete_version(key, version_id)`` — ListObjectVersions (versions
  and delete markers) / DeleteObject with ``versionId``.

Credentials: the settings' keys, else ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` /
``AWS_SESSION_TOKEN``. Without static keys (web identity, instance metadata) ``available``
is false: the store then cannot clean up what a listing misses, which ``S3Store.check``
logs — the bucket's ``AbortIncompleteMultipartUpload`` lifecycle rule is the fallback
(docs/operations.md).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import xml.etree.ElementTree as ET
from datetime import UTC, datetime
from urllib.parse import quote

import httpx

from .base import StoreUnavailable
from .settings import S3Settings

_SAFE = "-_.~"


def _q(value: str, safe: str = _SAFE) -> str:
    return quote(value, safe=safe)


def sign(
    method: str,
    host: str,
    path: str,
    query: dict[str, str],
    *,
    access_key: str,
    secret_key: str,
    region: str,
    token: str | None = None,
    body: bytes = b"",
    now: datetime | None = None,
) -> dict[str, str]:
    """The headers of a SigV4-signed S3 request (``path`` already percent-encoded, as
    sent; the body's SHA-256 signed)."""
    stamp = (now or datetime.now(UTC)).strftime("%Y%m%dT%H%M%SZ")
    digest = hashlib.sha256(body).hexdigest()
    headers = {"host": host, "x-amz-date": stamp, "x-amz-content-sha256": digest}
    if token:
        headers["x-amz-security-token"] = token
    canonical_query = "&".join(f"{_q(k)}={_q(v)}" for k, v in sorted(query.items()))
    names = sorted(headers)
    canonical = "\n".join(
        [
            method,
            path,
            canonical_query,
            "".join(f"{n}:{headers[n].strip()}\n" for n in names),
            ";".join(names),
            digest,
        ]
    )
    scope = f"{stamp[:8]}/{region}/s3/aws4_request"
    to_sign = "\n".join(
        ["AWS4-HMAC-SHA256", stamp, scope, hashlib.sha256(canonical.encode()).hexdigest()]
    )
    key = ("AWS4" + secret_key).encode()
    for part in (stamp[:8], region, "s3", "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    headers["authorization"] = (
        f"AWS4-HMAC-SHA256 Credential={access_key}/{scope}, "
        f"SignedHeaders={';'.join(names)}, Signature={signature}"
    )
    return headers


def _strip(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]


def _children(xml: bytes, name: str) -> list[dict[str, str]]:
    """The ``name`` elements of an S3 answer, each as {child tag: text}."""
    root = ET.fromstring(xml)
    return [
        {_strip(c.tag): (c.text or "") for c in el} for el in root.iter() if _strip(el.tag) == name
    ]


def _text(xml: bytes, name: str) -> str:
    for el in ET.fromstring(xml).iter():
        if _strip(el.tag) == name:
            return el.text or ""
    return ""


class S3Admin:
    """The bucket-level requests obstore lacks (module docstring)."""

    def __init__(self, settings: S3Settings) -> None:
        self.settings = settings
        s = settings
        self._access = (
            s.access_key_id.get_secret_value()
            if s.access_key_id
            else os.environ.get("AWS_ACCESS_KEY_ID")
        )
        self._secret = (
            s.secret_access_key.get_secret_value()
            if s.secret_access_key
            else os.environ.get("AWS_SECRET_ACCESS_KEY")
        )
        self._token = None if s.access_key_id else os.environ.get("AWS_SESSION_TOKEN")
        endpoint = (s.endpoint_url or f"https://s3.{s.region}.amazonaws.com").rstrip("/")
        scheme, host = endpoint.split("://", 1)
        if s.virtual_hosted_style:
            self._base, self._host, self._root = (
                f"{scheme}://{s.bucket}.{host}",
                f"{s.bucket}.{host}",
                "",
            )
        else:
            self._base, self._host, self._root = endpoint, host, f"/{_q(s.bucket or '')}"
        self._http = httpx.AsyncClient(timeout=httpx.Timeout(30, connect=5))

    @property
    def available(self) -> bool:
        return bool(self._access and self._secret)

    async def _call(
        self, method: str, key: str | None, query: dict[str, str], body: bytes = b""
    ) -> bytes:
        path = self._root + ("/" + _q(key, "/" + _SAFE) if key else "/")
        headers = sign(
            method, self._host, path, query, access_key=self._access or "",
            secret_key=self._secret or "", region=self.settings.region, token=self._token,
            body=body,
        )  # fmt: skip
        url = self._base + path
        if query:
            url += "?" + "&".join(f"{_q(k)}={_q(v)}" for k, v in sorted(query.items()))
        try:
            r = await self._http.request(method, url, headers=headers, content=body)
        except httpx.HTTPError as e:
            raise StoreUnavailable(f"object store error: {e.__class__.__name__}: {e}") from e
        if r.status_code == 404 and method == "DELETE":
            return b""
        if r.status_code >= 300:
            raise StoreUnavailable(
                f"object store refused {method} ?{'&'.join(query)}: {r.status_code} {r.text[:300]}"
            )
        return r.content

    async def uploads(self, prefix: str) -> list[tuple[str, str]]:
        """(key, upload id) of every incomplete multipart upload under ``prefix``."""
        found: list[tuple[str, str]] = []
        query = {"uploads": "", "prefix": prefix}
        while True:
            xml = await self._call("GET", None, query)
            found += [(u["Key"], u["UploadId"]) for u in _children(xml, "Upload")]
            if _text(xml, "IsTruncated") != "true":
                return found
            query = {**query, "key-marker": _text(xml, "NextKeyMarker"),
                     "upload-id-marker": _text(xml, "NextUploadIdMarker")}  # fmt: skip

    async def abort(self, key: str, upload_id: str) -> None:
        await self._call("DELETE", key, {"uploadId": upload_id})

    async def versioning(self) -> str:
        return _text(await self._call("GET", None, {"versioning": ""}), "Status")

    async def set_versioning(self, status: str) -> None:
        """PutBucketVersioning (tests and operators' tooling; the API never calls it)."""
        body = (
            '<VersioningConfiguration xmlns="http://s3.amazonaws.com/doc/2006-03-01/">'
            f"<Status>{status}</Status></VersioningConfiguration>"
        ).encode()
        await self._call("PUT", None, {"versioning": ""}, body)

    async def versions(self, prefix: str) -> list[tuple[str, str]]:
        """(key, version id) of every version and delete marker under ``prefix``."""
        found: list[tuple[str, str]] = []
        query = {"versions": "", "prefix": prefix}
        while True:
            xml = await self._call("GET", None, query)
            for kind in ("Version", "DeleteMarker"):
                found += [(v["Key"], v["VersionId"]) for v in _children(xml, kind)]
            if _text(xml, "IsTruncated") != "true":
                return found
            query = {**query, "key-marker": _text(xml, "NextKeyMarker"),
                     "version-id-marker": _text(xml, "NextVersionIdMarker")}  # fmt: skip

    async def delete_version(self, key: str, version_id: str) -> None:
        await self._call("DELETE", key, {"versionId": version_id})

    async def aclose(self) -> None:
        await self._http.aclose()
