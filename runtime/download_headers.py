"""Headers of every file download (runtime and API alike): the file is an attachment no
browser renders in the API's origin.

Contract: ``download_headers(name)`` is ``Content-Disposition: attachment`` (an ASCII
fallback and the exact name in RFC 5987 form), ``X-Content-Type-Options: nosniff`` and
``Content-Security-Policy: sandbox`` — an uploaded or code-written HTML or SVG file opened
by a navigation would otherwise run script in the API's origin, where the web page keeps
its token (docs/security.md).
"""

from __future__ import annotations

import urllib.parse

SAFE = {"X-Content-Type-Options": "nosniff", "Content-Security-Policy": "sandbox"}


def content_disposition(name: str) -> str:
    """``attachment`` with an ASCII fallback and the exact name in RFC 5987 form."""
    fallback = "".join(ch if 0x20 <= ord(ch) < 0x7F and ch not in '"\\%' else "_" for ch in name)
    quoted = urllib.parse.quote(name, safe="")
    return f"attachment; filename=\"{fallback}\"; filename*=UTF-8''{quoted}"


def download_headers(name: str) -> dict[str, str]:
    return {"Content-Disposition": content_disposition(name), **SAFE}
