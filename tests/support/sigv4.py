"""AWS Signature Version 4 for one S3 request, with the standard library only (test support).

``signed_headers(method, url, access_key, secret_key)`` → the headers of a signed request
(path-style URL, empty body, region ``us-east-1`` by default). Stdlib only and
self-contained on purpose: tests/node/test_store_isolation.py ships this module's source
into a sandbox pod, where code signs requests with whatever it found, and uses it on the
node to try the pod's secrets against the store.
"""

from __future__ import annotations

import datetime
import hashlib
import hmac
import urllib.parse

EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()


def _hmac(key: bytes, text: str) -> bytes:
    return hmac.new(key, text.encode(), hashlib.sha256).digest()


def signed_headers(
    method: str,
    url: str,
    access_key: str,
    secret_key: str,
    region: str = "us-east-1",
    now: datetime.datetime | None = None,
) -> dict[str, str]:
    parts = urllib.parse.urlsplit(url)
    stamp = (now or datetime.datetime.now(datetime.UTC)).strftime("%Y%m%dT%H%M%SZ")
    day = stamp[:8]
    headers = {"host": parts.netloc, "x-amz-content-sha256": EMPTY_SHA256, "x-amz-date": stamp}
    names = sorted(headers)
    path = urllib.parse.quote(urllib.parse.unquote(parts.path or "/"), safe="/-_.~")
    query = "&".join(
        f"{urllib.parse.quote(k, safe='-_.~')}={urllib.parse.quote(v, safe='-_.~')}"
        for k, v in sorted(urllib.parse.parse_qsl(parts.query, keep_blank_values=True))
    )
    canonical = "\n".join(
        [
            method,
            path,
            query,
            "".join(f"{n}:{headers[n]}\n" for n in names),
            ";".join(names),
            EMPTY_SHA256,
        ]
    )
    scope = f"{day}/{region}/s3/aws4_request"
    to_sign = "\n".join(
        ["AWS4-HMAC-SHA256", stamp, scope, hashlib.sha256(canonical.encode()).hexdigest()]
    )
    key = f"AWS4{secret_key}".encode()
    for part in (day, region, "s3", "aws4_request"):
        key = _hmac(key, part)
    signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    headers["authorization"] = (
        f"AWS4-HMAC-SHA256 Credential={access_key}/{scope}, "
        f"SignedHeaders={';'.join(names)}, Signature={signature}"
    )
    return headers
