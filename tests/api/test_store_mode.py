"""The API in ``SANDBOX_WORKSPACE_STORE=s3`` mode against a real SeaweedFS: it refuses to
start on a store it cannot use, with a message naming the setting to change."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.local_backend


def start_api(tmp_path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "sandbox_workspace", "dev", "--port", "0"],
        env={k: v for k, v in os.environ.items() if not k.startswith("SANDBOX_")} | env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_s3_mode_without_a_bucket_names_the_setting(tmp_path):
    done = start_api(tmp_path, SANDBOX_WORKSPACE_STORE="s3")
    assert done.returncode == 2
    assert "SANDBOX_WORKSPACE_S3__BUCKET" in done.stderr


def test_a_missing_bucket_stops_the_start(tmp_path, seaweedfs):
    done = start_api(tmp_path, **seaweedfs.env("no-such-bucket"))
    assert done.returncode == 2, done.stderr
    assert "does not exist" in done.stderr
    assert "SANDBOX_WORKSPACE_S3__BUCKET" in done.stderr


def test_bad_credentials_stop_the_start(tmp_path, seaweedfs, s3_bucket):
    env = seaweedfs.env(s3_bucket) | {"SANDBOX_WORKSPACE_S3__SECRET_ACCESS_KEY": "not-the-key"}
    done = start_api(tmp_path, **env)
    assert done.returncode == 2, done.stderr
    assert "SANDBOX_WORKSPACE_S3__SECRET_ACCESS_KEY" in done.stderr


# -- files through the store (local backend, s3 mode) ----------------------------------


def manifest(server, bucket: str, session_id: str, cid: str, tenant: str = "default") -> dict:
    """The conversation's metadata (head and shards), read straight from the bucket."""
    import asyncio
    from dataclasses import asdict

    from sandbox_workspace.store import S3Store
    from sandbox_workspace.store.layout import Layout, Scope
    from sandbox_workspace.store.metadata import Metadata

    async def read():
        store = S3Store(server.settings(bucket))
        try:
            m = await Metadata(store, Layout()).get(Scope(tenant, session_id), cid)
        finally:
            await store.aclose()
        return {"workspace_enabled": m.workspace_enabled,
                "files": [asdict(f) for f in m.files]}  # fmt: skip

    return asyncio.run(read())


def objects(server, bucket: str, prefix: str) -> list[str]:
    """The keys under ``prefix``, with the metadata's shards as one ``.sbw/shards/…``."""
    import asyncio

    from sandbox_workspace.store import S3Store

    async def keys():
        store = S3Store(server.settings(bucket))
        keys = [i.key async for i in store.list(prefix)]
        await store.aclose()
        return sorted({k.split("/.sbw/shards/")[0] + "/.sbw/shards/…" if "/.sbw/shards/" in k
                       else k for k in keys})  # fmt: skip

    return asyncio.run(keys())


def by_path(doc: dict) -> dict[str, dict]:
    return {f["file_path"]: f for f in doc["files"] if f["status"] == "active"}


def test_files_live_in_the_store_and_come_back_after_the_cache_is_lost(
    tmp_path, start_server, seaweedfs, s3_bucket
):
    """Upload, code that edits the upload and writes an output: all in the bucket with
    seed 003's metadata. Then the API stops, its data directory is deleted, a new API
    starts: the first execution sees every file, byte-identical, at the same path."""
    import hashlib
    import shutil

    import httpx
    from api_calls import execute

    data = tmp_path / "data"
    env = {"SANDBOX_WORKSPACE_SANDBOX_MOUNT": "none", **seaweedfs.env(s3_bucket)}
    server = start_server("dev", "--data-dir", str(data), **env)
    user = "store-user"
    sid = f"sb-session-{user}"
    url = f"/api/v1/sessions/{sid}"
    payload = bytes(range(256)) * 4096  # 1 MiB
    with httpx.Client(base_url=server.url, headers={"X-User-Id": user}, timeout=60) as api:
        r = api.post(
            f"{url}/files/upload",
            files={"file": ("in.csv", payload)},
            data={"conversation_id": "c1"},
        )
        assert r.status_code == 201, r.text
        first = by_path(manifest(seaweedfs, s3_bucket, sid, "c1"))["uploads/temparea/in.csv"]
        assert (first["source"], first["version"], first["file_size"]) == (
            "user_upload",
            1,
            len(payload),
        )
        assert first["checksum"] == hashlib.sha256(payload).hexdigest()
        code = (
            "open('uploads/temparea/in.csv', 'ab').write(b'+');"
            "open('outputs/report.txt', 'w').write('made by code')"
        )
        assert execute(api, url, code, cid="c1")["exit_code"] == 0
        # The cache's copy no longer has its recorded digest: served from the store.
        got = api.get(f"{url}/files/in.csv", params={"conversation_id": "c1"})
        assert got.content == payload + b"+"
        assert got.headers["x-content-sha256"] == hashlib.sha256(payload + b"+").hexdigest()
    files = by_path(manifest(seaweedfs, s3_bucket, sid, "c1"))
    edited, report = files["uploads/temparea/in.csv"], files["outputs/report.txt"]
    assert (edited["file_id"], edited["version"], edited["source"]) == (
        first["file_id"],
        2,
        "ai_modified",
    )
    assert (report["source"], report["version"], report["file_size"]) == ("ai_created", 1, 12)
    assert objects(seaweedfs, s3_bucket, f"workspaces/default/{sid}/c1/") == [
        f"workspaces/default/{sid}/c1/.sbw/files.json",
        f"workspaces/default/{sid}/c1/.sbw/shards/…",
        f"workspaces/default/{sid}/c1/outputs/report.txt",
        f"workspaces/default/{sid}/c1/uploads/temparea/in.csv",
    ]

    server.stop()
    shutil.rmtree(data)
    server = start_server("dev", "--data-dir", str(data), **env)
    with httpx.Client(base_url=server.url, headers={"X-User-Id": user}, timeout=60) as api:
        code = (
            "import hashlib;"
            "print(hashlib.sha256(open('uploads/temparea/in.csv','rb').read()).hexdigest());"
            "print(open('outputs/report.txt').read())"
        )
        result = execute(api, url, code, cid="c1")
        assert result["stdout"].split("\n")[:2] == [
            hashlib.sha256(payload + b"+").hexdigest(),
            "made by code",
        ]
        listing = api.get(f"{url}/files", params={"conversation_id": "c1"}).json()
        assert listing["files"] == ["in.csv"]
        # An output deleted by file_id leaves the store and the cache.
        r = api.delete(f"{url}/workspace/c1/files/{report['file_id']}")
        assert r.status_code == 200 and r.json()["status"] == "deleted"
        gone = execute(api, url, "import os; print(os.path.exists('outputs/report.txt'))", cid="c1")
        assert gone["stdout"].strip() == "False"
        # Deleting the conversation empties its prefix in the store.
        r = api.delete(f"{url}/conversations/c1")
        assert r.status_code in (200, 202), r.text
    assert objects(seaweedfs, s3_bucket, f"workspaces/default/{sid}/c1/") == []


def test_a_file_deleted_through_the_v1_route_never_comes_back(
    tmp_path, start_server, seaweedfs, s3_bucket
):
    """Issue 33 item 2 (review H2): ``DELETE …/files/{name}`` — the web page's Delete —
    removes the object and marks the record deleted, not just the cache's copy. Then a
    refill (the API restarts with its data directory gone, so the cache is rebuilt from the
    store, as on a resume or another replica) brings back the file kept and never the one
    deleted, on any route."""
    import shutil

    import httpx
    from api_calls import execute

    data = tmp_path / "data"
    env = {"SANDBOX_WORKSPACE_SANDBOX_MOUNT": "none", **seaweedfs.env(s3_bucket)}
    server = start_server("dev", "--data-dir", str(data), **env)
    user, cid = "gone-user", "c1"
    sid = f"sb-session-{user}"
    url = f"/api/v1/sessions/{sid}"
    prefix = f"workspaces/default/{sid}/{cid}/"
    listed = "import os; print(sorted(os.listdir('uploads/temparea')))"

    def check_only_kept(api: httpx.Client) -> None:
        listing = api.get(f"{url}/files", params={"conversation_id": cid}).json()
        assert listing["files"] == ["keep.csv"], listing
        assert api.get(f"{url}/files", params={}).json()["files"] == ["keep.csv"]
        r = api.get(f"{url}/files/gone.csv", params={"conversation_id": cid})
        assert r.status_code == 404, r.text
        info = api.get(f"{url}/workspace/{cid}").json()
        assert [f["file_path"] for f in info["files"]] == ["uploads/temparea/keep.csv"]

    with httpx.Client(base_url=server.url, headers={"X-User-Id": user}, timeout=60) as api:
        for name in ("keep.csv", "gone.csv"):
            r = api.post(
                f"{url}/files/upload",
                files={"file": (name, f"bytes of {name}".encode())},
                data={"conversation_id": cid},
            )
            assert r.status_code == 201, r.text
        r = api.delete(f"{url}/files/gone.csv", params={"conversation_id": cid})
        assert r.status_code == 200 and r.json()["deleted"] is True, r.text
        check_only_kept(api)
        assert execute(api, url, listed, cid=cid)["stdout"].strip() == "['keep.csv']"
    doc = manifest(seaweedfs, s3_bucket, sid, cid)
    states = {f["file_path"]: f["status"] for f in doc["files"]}
    assert states == {"uploads/temparea/keep.csv": "active", "uploads/temparea/gone.csv": "deleted"}
    assert objects(seaweedfs, s3_bucket, prefix) == [
        f"{prefix}.sbw/files.json",
        f"{prefix}.sbw/shards/…",
        f"{prefix}uploads/temparea/keep.csv",
    ]

    server.stop()
    shutil.rmtree(data)  # the cache is lost: the first use refills it from the store
    server = start_server("dev", "--data-dir", str(data), **env)
    with httpx.Client(base_url=server.url, headers={"X-User-Id": user}, timeout=60) as api:
        # The first read refills the new cache from the store: the file kept, not the other.
        got = api.get(f"{url}/files/keep.csv", params={"conversation_id": cid})
        assert got.content == b"bytes of keep.csv"
        check_only_kept(api)
        assert execute(api, url, listed, cid=cid)["stdout"].strip() == "['keep.csv']"


def test_a_chat_run_writes_back_after_its_tools_and_marks_presented_files(
    tmp_path, start_server, seaweedfs, s3_bucket, scripted_llm
):
    """A run's bash tool writes an output, present_file offers it: the output is in the
    store as ai_created, with is_presented once the run has its result."""
    import httpx
    from scripted_llm import text_reply, tool_reply, tool_results
    from sse_stream import Stream

    def respond(body: dict):
        done = len(tool_results(body))
        if done == 0:
            return tool_reply("bash", {"command": "mkdir -p outputs && echo hi > outputs/r.txt"})
        if done == 1:
            return tool_reply("present_file", {"path": "outputs/r.txt"}, call_id="call_2")
        return text_reply("Here is your report.")

    scripted_llm.responder = respond
    env = {
        "SANDBOX_WORKSPACE_LLM_BASE_URL": scripted_llm.url,
        "SANDBOX_WORKSPACE_LLM_MODEL": "scripted",
        "SANDBOX_WORKSPACE_SANDBOX_MOUNT": "none",
        **seaweedfs.env(s3_bucket),
    }
    server = start_server("dev", "--data-dir", str(tmp_path / "data"), **env)
    user = "chat-store-user"
    with (
        httpx.Client(base_url=server.url, headers={"X-User-Id": user}, timeout=60) as api,
        api.stream("POST", "/api/v1/chat", json={"conversation_id": "c", "query": "go"}) as r,
    ):
        Stream(r).until("result")
    record = by_path(manifest(seaweedfs, s3_bucket, f"sb-session-{user}", "c"))
    assert record["outputs/r.txt"]["source"] == "ai_created"
    assert record["outputs/r.txt"]["is_presented"] is True


def seed_003_contract(server) -> tuple[str, dict]:
    """Seed 003's routes as a client uses them: upload with a description, workspace
    information, download and delete by file_id — in the caller's tenant only; a disabled
    workspace refuses writes. Answers the session's own id and the file's record."""
    import httpx

    user, sid = "seed3-user", "sb-session-seed3-user"  # names the caller's acme session
    own = "sb-tenant-4-acme-seed3-user"  # that session's own id (one per tenant and user)
    seed = "/api/tenants/acme/workspace/c9"
    v1 = f"/api/v1/sessions/{sid}/workspace/c9"
    headers = {"X-User-Id": user, "X-Tenant-Id": "acme"}
    with httpx.Client(base_url=server.url, headers=headers, timeout=60) as api:
        r = api.post(
            f"{seed}/files",
            files={"file": ("notes.txt", b"seed three")},
            data={"description": "meeting notes"},
        )
        assert r.status_code == 201, r.text
        record = r.json()
        assert (record["source"], record["version"], record["description"]) == (
            "user_upload",
            1,
            "meeting notes",
        )
        assert (record["file_path"], record["file_size"]) == ("uploads/temparea/notes.txt", 10)

        r = api.post(
            f"{seed}/files",
            files={"file": ("long.txt", b"x")},
            data={"description": "d" * 4097},
        )
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_description"
        info = api.get(seed).json()
        assert (info["workspace_enabled"], info["file_count"], info["total_size"]) == (
            True,
            1,
            10,
        )
        assert info["workspace_path"].endswith("/c9")
        assert [f["file_id"] for f in info["files"]] == [record["file_id"]]
        assert api.get(v1).json()["files"] == info["files"]  # the same, under the session

        got = api.get(f"{seed}/files/{record['file_id']}")
        assert got.status_code == 200 and got.content == b"seed three"
        assert got.headers["content-type"].startswith("text/plain")

        # Another tenant's path, or another tenant's caller: 404, as a foreign session.
        assert api.get("/api/tenants/other/workspace/c9").status_code == 404
        other = api.get(seed, headers={"X-Tenant-Id": "other"})
        assert other.status_code == 404

        # Disabled: uploads and executions refused with a clear error; enabled again: fine.
        assert api.patch(v1, json={"workspace_enabled": False}).json()["workspace_enabled"] is False
        r = api.post(f"{seed}/files", files={"file": ("b.txt", b"x")})
        assert r.status_code == 409 and r.json()["error"]["code"] == "workspace_disabled"
        r = api.post(
            f"/api/v1/sessions/{sid}/execute",
            json={"conversation_id": "c9", "language": "bash", "code": "echo x > outputs/y"},
        )
        assert r.status_code == 409 and r.json()["error"]["code"] == "workspace_disabled"
        assert api.patch(v1, json={"workspace_enabled": True}).status_code == 200

        r = api.delete(f"{seed}/files/{record['file_id']}")
        assert r.status_code == 200 and r.json()["status"] == "deleted"
        assert api.get(f"{seed}/files/{record['file_id']}").status_code == 404
        assert api.delete(f"{seed}/files/{record['file_id']}").status_code == 404
        listing = api.get(f"/api/v1/sessions/{sid}/files", params={"conversation_id": "c9"})
        assert listing.json()["files"] == []
    return own, record


@pytest.mark.parametrize("mode", ["s3", "local"])
def test_seed_003_operations_by_file_id_and_tenant(tmp_path, start_server, request, mode):
    """The same contract in both store modes (issue 36 item 8): with the object store,
    the records and objects are the bucket's; on the embedded default, the records are
    kept beside the sessions and the files are the workspace's."""
    import httpx

    env = {"SANDBOX_WORKSPACE_SANDBOX_MOUNT": "none"}
    if mode == "s3":
        seaweedfs, s3_bucket = (request.getfixturevalue(f) for f in ("seaweedfs", "s3_bucket"))
        env |= seaweedfs.env(s3_bucket)
    server = start_server("dev", "--data-dir", str(tmp_path / "data"), **env)
    own, record = seed_003_contract(server)
    sid, headers = "sb-session-seed3-user", {"X-User-Id": "seed3-user", "X-Tenant-Id": "acme"}
    if mode == "local":  # the records follow the workspace: code's writes, v1's deletes
        import hashlib

        from api_calls import execute

        v1 = f"/api/v1/sessions/{sid}"
        with httpx.Client(base_url=server.url, headers=headers, timeout=60) as api:
            r = api.post(
                f"{v1}/files/upload",
                files={"file": ("v1.txt", b"by v1")},
                data={"conversation_id": "c9"},
            )
            assert r.status_code == 201, r.text
            execute(api, v1, "printf hi > outputs/made.txt", cid="c9", language="bash")
            files = {f["file_path"]: f for f in api.get(f"{v1}/workspace/c9").json()["files"]}
            assert set(files) == {"uploads/temparea/v1.txt", "outputs/made.txt"}
            made = files["outputs/made.txt"]
            assert (made["source"], made["checksum"]) == (
                "ai_created",
                hashlib.sha256(b"hi").hexdigest(),
            )
            got = api.get(f"/api/tenants/acme/workspace/c9/files/{made['file_id']}")
            assert got.content == b"hi" and got.headers["x-file-version"] == "1"
            assert api.delete(f"{v1}/files/v1.txt", params={"conversation_id": "c9"}).is_success
            execute(api, v1, "rm outputs/made.txt", cid="c9", language="bash")
            assert api.get(f"{v1}/workspace/c9").json()["files"] == []
            r = api.get(f"/api/tenants/acme/workspace/c9/files/{made['file_id']}")
            assert r.status_code == 404
        records = tmp_path / "data" / "records" / "objects" / "workspaces" / "acme"
        assert [p.name for p in records.iterdir()] == [own]
        r = httpx.delete(f"{server.url}/api/v1/sessions/{sid}", headers=headers, timeout=60)
        assert r.status_code in (200, 202, 204), r.text
        assert list(records.iterdir()) == []  # the session's records went with it
        return
    doc = manifest(seaweedfs, s3_bucket, own, "c9", tenant="acme")
    assert [(f["file_id"], f["status"]) for f in doc["files"]] == [(record["file_id"], "deleted")]
    assert objects(seaweedfs, s3_bucket, f"workspaces/acme/{own}/c9/") == [
        f"workspaces/acme/{own}/c9/.sbw/files.json",
        f"workspaces/acme/{own}/c9/.sbw/shards/…",
    ]
    # Deleting the session deletes every object of its conversations.
    r = httpx.delete(f"{server.url}/api/v1/sessions/{sid}", headers=headers, timeout=60)
    assert r.status_code in (200, 202, 204), r.text
    assert objects(seaweedfs, s3_bucket, f"workspaces/acme/{own}/") == []


def test_one_user_id_in_two_tenants_has_two_sessions_and_sees_only_its_own_files(
    tmp_path, start_server, seaweedfs, s3_bucket
):
    """Callers with the same user id in the default tenant, acme and globex (X-Tenant-Id)
    each get a session of their own: the same conversation id and file name hold each
    one's own bytes through every route, in each one's own keys; another tenant's
    session id is 404."""
    import httpx
    from api_calls import execute

    env = {"SANDBOX_WORKSPACE_SANDBOX_MOUNT": "none", **seaweedfs.env(s3_bucket)}
    server = start_server("dev", "--data-dir", str(tmp_path / "data"), **env)
    user, tenants = "same-user", ("default", "acme", "globex")
    sids = {}

    def client(tenant: str) -> httpx.Client:
        headers = {"X-User-Id": user} | ({} if tenant == "default" else {"X-Tenant-Id": tenant})
        return httpx.Client(base_url=server.url, headers=headers, timeout=60)

    for tenant in tenants:  # each uploads through the id clients build: sb-session-{user}
        with client(tenant) as api:
            r = api.post(
                f"/api/v1/sessions/sb-session-{user}/files/upload",
                files={"file": ("same.txt", f"bytes of {tenant}".encode())},
                data={"conversation_id": "c1"},
            )
            assert r.status_code == 201, r.text
            sids[tenant] = api.get(f"/api/v1/sessions/sb-session-{user}").json()["session_id"]
    assert sids == {
        "default": f"sb-session-{user}",
        "acme": f"sb-tenant-4-acme-{user}",
        "globex": f"sb-tenant-6-globex-{user}",
    }
    for tenant in tenants:
        mine = f"bytes of {tenant}".encode()
        base = f"/api/v1/sessions/{sids[tenant]}"
        with client(tenant) as api:
            listing = api.get(f"{base}/files", params={"conversation_id": "c1"}).json()
            assert [(f["name"], f["size"]) for f in listing["items"]] == [("same.txt", len(mine))]
            got = api.get(f"{base}/files/same.txt", params={"conversation_id": "c1"})
            assert got.content == mine
            cat = execute(api, base, "cat uploads/temparea/same.txt", cid="c1", language="bash")
            assert cat["stdout"] == mine.decode()
            if tenant != "default":
                info = api.get(f"/api/tenants/{tenant}/workspace/c1").json()
                assert [f["file_size"] for f in info["files"]] == [len(mine)]
                one = api.get(
                    f"/api/tenants/{tenant}/workspace/c1/files/{info['files'][0]['file_id']}"
                )
                assert one.content == mine
            for other in tenants:
                if other in (tenant, "default"):  # sb-session-{user}: the caller's own
                    own = api.get(f"/api/v1/sessions/sb-session-{user}").json()
                    assert own["session_id"] == sids[tenant]
                else:  # another tenant's session: not found, on every route
                    foreign = f"/api/v1/sessions/{sids[other]}"
                    assert api.get(foreign).status_code == 404
                    r = api.get(f"{foreign}/files", params={"conversation_id": "c1"})
                    assert r.status_code == 404
                    assert api.get(f"{foreign}/workspace/c1").status_code == 404
                    assert api.get(f"/api/tenants/{other}/workspace/c1").status_code == 404
        key = f"workspaces/{tenant}/{sids[tenant]}/c1/uploads/temparea/same.txt"
        assert key in objects(seaweedfs, s3_bucket, f"workspaces/{tenant}/{sids[tenant]}/")
