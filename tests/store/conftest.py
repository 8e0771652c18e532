"""The ``store`` fixture: each store test runs against both implementations — a local
directory (``DirStore``) and a real SeaweedFS (``S3Store``, a fresh bucket per test)."""

from __future__ import annotations

import pytest

from sandbox_workspace.store import DirStore, S3Store


@pytest.fixture(params=["dir", "s3"])
async def store(request, tmp_path):
    if request.param == "dir":
        s = DirStore(tmp_path / "store")
    else:
        server = request.getfixturevalue("seaweedfs")
        s = S3Store(server.settings(request.getfixturevalue("s3_bucket")))
    await s.check()
    yield s
    await s.aclose()
