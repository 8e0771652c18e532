"""The ``store`` fixture: each store test runs against both implementations — a local
directory (``DirStore``) and a real SeaweedFS (``S3Store``, a fresh bucket per test), the
latter twice: downloads over the plain GET (``s3_get``, the default for an http://
endpoint) and through the S3 client (``plain_get=False``, what a TLS endpoint uses)."""

from __future__ import annotations

import pytest

from sandbox_workspace.store import DirStore, S3Store


@pytest.fixture(params=["dir", "s3", "s3-client"])
async def store(request, tmp_path):
    if request.param == "dir":
        s = DirStore(tmp_path / "store")
    else:
        server = request.getfixturevalue("seaweedfs")
        bucket = request.getfixturevalue("s3_bucket")
        s = S3Store(server.settings(bucket, plain_get=request.param == "s3"))
    await s.check()
    yield s
    await s.aclose()
