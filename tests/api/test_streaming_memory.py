"""Uploads and downloads stream: a large file never sits in the API's or runtime's memory."""

from __future__ import annotations

import hashlib
from pathlib import Path

import httpx

SIZE = 320 * 1024 * 1024
CHUNK = 1024 * 1024
RSS_GROWTH_LIMIT = 64 * 1024 * 1024


def peak_rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def test_large_upload_and_download_stream_in_bounded_memory(start_server, runtime_pids):
    server = start_server("dev", "--data-dir", "data", SANDBOX_WORKSPACE_SANDBOX_MOUNT="none")
    upload_and_download(server, runtime_pids)


def test_in_store_mode_too(start_server, runtime_pids, seaweedfs, s3_bucket):
    """SANDBOX_WORKSPACE_STORE=s3: the upload also streams runtime → store (multipart,
    bounded parts in flight) before the answer, and the API's memory stays flat."""
    server = start_server(
        "dev",
        "--data-dir",
        "data",
        SANDBOX_WORKSPACE_SANDBOX_MOUNT="none",
        **seaweedfs.env(s3_bucket),
    )
    upload_and_download(server, runtime_pids)
    [info] = [
        i
        for i in seaweedfs.list_keys(s3_bucket, "workspaces/")
        if i.key.endswith("/c/uploads/temparea/big.bin")
    ]
    assert info.size == SIZE


def upload_and_download(server, runtime_pids) -> None:
    user, url = "big", "/api/v1/sessions/sb-session-big"
    limits = {"max_file_size": 1, "max_file_size_unit": "GB", "allowed_file_types": []}
    with httpx.Client(base_url=server.url, headers={"X-User-Id": user}, timeout=300) as api:
        assert (
            api.post(
                "/api/v1/sessions", json={"config": {"file_upload_config": limits}}
            ).status_code
            == 201
        )
        api.get(f"{url}/files", params={"conversation_id": "c"})  # wait until running
        [runtime_pid] = runtime_pids(server.workdir)
        before = {server.proc.pid: peak_rss(server.proc.pid), runtime_pid: peak_rss(runtime_pid)}

        boundary = "streamboundary"
        digest = hashlib.sha256()
        block = bytes(range(256)) * (CHUNK // 256)

        def body():
            yield (
                f'--{boundary}\r\nContent-Disposition: form-data; name="conversation_id"'
                f"\r\n\r\nc\r\n--{boundary}\r\nContent-Disposition: form-data; "
                f'name="file"; filename="big.bin"\r\n\r\n'
            ).encode()
            for i in range(SIZE // CHUNK):
                chunk = block[i % 256 :] + block[: i % 256]
                digest.update(chunk)
                yield chunk
            yield f"\r\n--{boundary}--\r\n".encode()

        r = api.post(
            f"{url}/files/upload",
            content=body(),
            headers={"Content-Type": f"multipart/form-data; boundary={boundary}"},
        )
        assert r.status_code == 201, r.text
        assert r.json()["size"] == SIZE and r.json()["sha256"] == digest.hexdigest()

        downloaded = hashlib.sha256()
        with api.stream("GET", f"{url}/files/big.bin", params={"conversation_id": "c"}) as got:
            assert got.status_code == 200
            for chunk in got.iter_bytes(CHUNK):
                downloaded.update(chunk)
        assert downloaded.hexdigest() == digest.hexdigest()

        for pid, start in before.items():
            growth = peak_rss(pid) - start
            assert growth < RSS_GROWTH_LIMIT, f"pid {pid} peak RSS grew {growth >> 20} MiB"
