"""Deletion leaves nothing in the bucket (real SeaweedFS, s3 mode): not the parts of an
upload whose API was killed mid-body (a listing never shows an incomplete multipart
upload), not the non-current versions of a versioned bucket. A versioned bucket is refused
at start unless ``SANDBOX_WORKSPACE_S3__VERSIONED_BUCKET=delete_versions``."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading
import time

import httpx
import pytest

from sandbox_workspace.store.s3_admin import S3Admin

from .test_store_mode import objects

pytestmark = pytest.mark.local_backend

USER = "left"
SID = f"sb-session-{USER}"


def admin_call(seaweedfs, bucket: str, name: str, *args):
    async def call():
        admin = S3Admin(seaweedfs.settings(bucket))
        try:
            return await getattr(admin, name)(*args)
        finally:
            await admin.aclose()

    return asyncio.run(call())


def kill_group(server) -> None:
    """SIGKILL the API and its runtime (one process group): no cleanup runs."""
    os.killpg(server.proc.pid, signal.SIGKILL)
    server.proc.wait()


def test_a_versioned_bucket_is_refused_unless_versions_are_deleted(
    start_server, seaweedfs, tmp_path
):
    bucket = "t-versioned-refused"
    seaweedfs.make_bucket(bucket)
    admin_call(seaweedfs, bucket, "set_versioning", "Enabled")
    env = {"SANDBOX_WORKSPACE_SANDBOX_MOUNT": "none", **seaweedfs.env(bucket)}
    with pytest.raises(RuntimeError, match="VERSIONED_BUCKET=delete_versions"):
        start_server("dev", "--data-dir", str(tmp_path / "d"), **env)


def test_api_killed_mid_upload_then_conversation_deleted_leaves_nothing(
    start_server, seaweedfs, tmp_path
):
    bucket = "t-leftovers"
    seaweedfs.make_bucket(bucket)
    admin_call(seaweedfs, bucket, "set_versioning", "Enabled")
    env = {
        "SANDBOX_WORKSPACE_SANDBOX_MOUNT": "none",
        "SANDBOX_WORKSPACE_S3__VERSIONED_BUCKET": "delete_versions",
        **seaweedfs.env(bucket),
    }
    data = tmp_path / "data"
    prefix = f"workspaces/default/{SID}/c1/"
    server = start_server("dev", "--data-dir", str(data), **env)
    headers = {"X-User-Id": USER}
    with httpx.Client(base_url=server.url, headers=headers, timeout=60) as api:
        assert api.post("/api/v1/sessions", json={}).status_code == 201
        for body in (b"one", b"two"):  # the same file twice: a non-current version
            r = api.post(
                f"/api/v1/sessions/{SID}/files/upload",
                files={"file": ("a.txt", body)},
                data={"conversation_id": "c1"},
            )
            assert r.status_code == 201, r.text

    # A large upload, held mid-body once the store has its multipart upload under way.
    release = threading.Event()

    boundary = "leftoverboundary"

    def body():
        yield (
            f'--{boundary}\r\nContent-Disposition: form-data; name="conversation_id"\r\n\r\n'
            f'c1\r\n--{boundary}\r\nContent-Disposition: form-data; name="file"; '
            'filename="big.csv"\r\nContent-Type: application/octet-stream\r\n\r\n'
        ).encode()
        for i in range(64):
            if i == 24:
                release.wait(60)
            yield bytes([i]) * (1024 * 1024)
        yield f"\r\n--{boundary}--\r\n".encode()

    answered = []

    def upload():
        with contextlib.suppress(httpx.HTTPError):  # the API is killed under it
            answered.append(httpx.post(
                f"{server.url}/api/v1/sessions/{SID}/files/upload",
                headers={**headers,
                         "Content-Type": f"multipart/form-data; boundary={boundary}"},
                content=body(), timeout=60,
            ))  # fmt: skip

    thread = threading.Thread(target=upload, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not admin_call(seaweedfs, bucket, "uploads", prefix):
        assert time.monotonic() < deadline, f"no multipart upload began: {answered}"
        time.sleep(0.1)
    kill_group(server)
    release.set()
    thread.join(30)
    assert admin_call(seaweedfs, bucket, "uploads", prefix)  # what a dead API leaves
    assert len(admin_call(seaweedfs, bucket, "versions", prefix)) >= 3

    server = start_server("dev", "--data-dir", str(data), **env)
    with httpx.Client(base_url=server.url, headers=headers, timeout=120) as api:
        r = api.delete(f"/api/v1/sessions/{SID}/conversations/c1")
        assert r.status_code in (200, 202, 204), r.text
    assert objects(seaweedfs, bucket, prefix) == []
    assert admin_call(seaweedfs, bucket, "uploads", prefix) == []
    assert admin_call(seaweedfs, bucket, "versions", prefix) == []
