"""Files through the API and the local backend: round trips, limits, isolation, deletion."""

from __future__ import annotations

import asyncio
import hashlib
import os
import time
import urllib.parse
from pathlib import Path

import httpx
import pytest
from api_calls import execute

SMALL_LIMITS = {
    "max_file_size": 1,
    "max_file_size_unit": "KB",
    "max_file_count": 2,
    "allowed_file_types": ["csv", "txt"],
}


def upload(
    api: httpx.Client, session_url: str, cid: str, name: str, data: bytes, **extra: str
) -> httpx.Response:
    return api.post(
        f"{session_url}/files/upload",
        files={"file": (name, data)},
        data={"conversation_id": cid, "subdir": "temparea", **extra},
    )


def listing(api: httpx.Client, session_url: str, cid: str) -> list[dict]:
    r = api.get(f"{session_url}/files", headers={"conversation_id": cid, "subdir": "temparea"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["files"] == [f["name"] for f in body["items"]]  # names, as seed 000 §6.3
    return body["items"]


def workspace_of(api: httpx.Client, session_url: str) -> Path:
    return Path(api.get(session_url).json()["workspace_path"])


def assert_no_staged_files(workspace: Path) -> None:
    staging = workspace / ".runtime" / "staging"
    assert list(staging.iterdir()) == [], "a refused upload left a partial file"


@pytest.mark.parametrize(
    "name",
    [
        pytest.param("data.csv", id="ascii"),
        pytest.param("数据 分析.csv", id="cjk-with-space"),
        pytest.param('Ünïcödé ✓ "quoted" 100%.txt', id="latin-symbols-quote-percent"),
        pytest.param("emoji 📊 report.json", id="emoji"),
    ],
)
def test_upload_list_download_is_byte_identical(api, session_url, name):
    data = os.urandom(300_000) + name.encode()
    sha = hashlib.sha256(data).hexdigest()
    r = upload(api, session_url, "conv-1", name, data)
    assert r.status_code == 201, r.text
    body = r.json()
    assert (body["name"], body["size"], body["sha256"]) == (name, len(data), sha)
    # The reported path is exactly where code in the sandbox finds the bytes.
    assert Path(body["path"]).read_bytes() == data
    assert body["path"].endswith(f"/conv-1/uploads/temparea/{name}")

    [listed] = listing(api, session_url, "conv-1")
    assert (listed["name"], listed["size"], listed["sha256"]) == (name, len(data), sha)
    assert listed["uploaded_at"] and listed["mime_type"]

    quoted = urllib.parse.quote(name, safe="")
    got = api.get(f"{session_url}/files/{quoted}", params={"conversation_id": "conv-1"})
    assert got.status_code == 200
    assert hashlib.sha256(got.content).hexdigest() == sha
    disposition = got.headers["content-disposition"]
    assert disposition.startswith("attachment;")
    assert f"filename*=UTF-8''{quoted}" in disposition
    assert disposition.isascii()


def test_download_by_full_sandbox_path(api, session_url):
    path = upload(api, session_url, "c-path", "t.csv", b"a,b\n").json()["path"]
    got = api.get(f"{session_url}/files/{path}")
    assert got.status_code == 200 and got.content == b"a,b\n"
    assert got.headers["content-type"].startswith("text/csv")


def test_listing_shows_uploads_only_not_agent_files(api, session_url):
    body = upload(api, session_url, "c-mixed", "user.csv", b"1").json()
    temparea = Path(body["path"]).parent
    (temparea / "written-by-agent.csv").write_text("agent")
    outputs = temparea.parent.parent / "outputs"
    (outputs / "result.png").write_bytes(b"png")
    assert [f["name"] for f in listing(api, session_url, "c-mixed")] == ["user.csv"]
    r = api.get(f"{session_url}/files/written-by-agent.csv", params={"conversation_id": "c-mixed"})
    assert r.status_code == 404


def test_same_name_replaces_atomically(api, session_url):
    assert upload(api, session_url, "c", "x.txt", b"one").json()["replaced"] is False
    second = upload(api, session_url, "c", "x.txt", b"two!")
    assert second.json()["replaced"] is True
    [only] = listing(api, session_url, "c")
    assert only["size"] == 4 and Path(second.json()["path"]).read_bytes() == b"two!"


def test_delete_one_file(api, session_url):
    path = Path(upload(api, session_url, "c", "gone.txt", b"bye").json()["path"])
    r = api.delete(f"{session_url}/files/gone.txt", params={"conversation_id": "c"})
    assert r.status_code == 200 and r.json()["deleted"] is True
    assert not path.exists() and listing(api, session_url, "c") == []
    again = api.delete(f"{session_url}/files/gone.txt", params={"conversation_id": "c"})
    assert again.status_code == 404 and again.json()["error"]["code"] == "not_found"


def test_conversation_delete_removes_files_and_is_idempotent(api, session_url):
    paths = [
        Path(upload(api, session_url, "doomed", f"f{i}.csv", b"x").json()["path"]) for i in range(3)
    ]
    keep = Path(upload(api, session_url, "kept", "k.csv", b"k").json()["path"])
    conversation_dir = paths[0].parents[2]
    r = api.delete(f"{session_url}/conversations/doomed")
    # 200: verified gone on return (local backend); 202: requested, the operator's
    # finalizer deletes and verifies (kubernetes backend).
    assert (r.status_code, r.json()["status"]) in ((200, "deleted"), (202, "deleting"))
    deadline = time.monotonic() + 30
    while conversation_dir.exists():
        assert time.monotonic() < deadline, "the conversation's files were not deleted"
        time.sleep(0.05)
    assert listing(api, session_url, "doomed") == []
    assert keep.read_bytes() == b"k", "other conversations are untouched"
    assert api.delete(f"{session_url}/conversations/doomed").status_code in (200, 202)


@pytest.fixture
def limited_session(api, session_url):
    r = api.post("/api/v1/sessions", json={"config": {"file_upload_config": SMALL_LIMITS}})
    assert r.status_code == 201, r.text
    return session_url


def test_too_large_answers_413_and_leaves_nothing(api, limited_session):
    r = upload(api, limited_session, "c", "big.csv", b"x" * 1025)
    assert r.status_code == 413 and r.json()["error"]["code"] == "file_too_large"
    ws = workspace_of(api, limited_session)
    assert not (ws / "c" / "uploads" / "temparea" / "big.csv").exists()
    assert_no_staged_files(ws)
    assert listing(api, limited_session, "c") == []


def test_too_large_streamed_without_length_is_refused_while_streaming(api, limited_session):
    boundary = "b0undary"
    head = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="conversation_id"\r\n\r\n'
        f'c\r\n--{boundary}\r\nContent-Disposition: form-data; name="file"; '
        f'filename="big.csv"\r\n\r\n'
    ).encode()

    def body():
        yield head
        for _ in range(64):
            yield b"y" * 1024
        yield f"\r\n--{boundary}--\r\n".encode()

    r = api.post(
        f"{limited_session}/files/upload",
        content=body(),
        headers={"Content-Type": f"multipart/form-data; boundary={boundary}"},
    )
    assert r.status_code == 413
    assert_no_staged_files(workspace_of(api, limited_session))
    assert listing(api, limited_session, "c") == []


def test_type_not_allowed_answers_415(api, limited_session):
    r = upload(api, limited_session, "c", "script.sh", b"echo")
    assert r.status_code == 415
    assert "csv, txt" in r.json()["error"]["message"]
    assert_no_staged_files(workspace_of(api, limited_session))


def test_count_limit_answers_409_but_replacing_is_allowed(api, limited_session):
    assert upload(api, limited_session, "c", "1.csv", b"1").status_code == 201
    assert upload(api, limited_session, "c", "2.csv", b"2").status_code == 201
    third = upload(api, limited_session, "c", "3.csv", b"3")
    assert third.status_code == 409 and third.json()["error"]["code"] == "file_count_exceeded"
    assert upload(api, limited_session, "c", "2.csv", b"22").status_code == 201
    assert upload(api, limited_session, "other", "3.csv", b"3").status_code == 201
    assert sorted(f["name"] for f in listing(api, limited_session, "c")) == ["1.csv", "2.csv"]
    assert_no_staged_files(workspace_of(api, limited_session))


@pytest.mark.parametrize(
    ("kwargs", "status", "code"),
    [
        pytest.param(
            {"data": {"conversation_id": "c"}}, 415, "unsupported_content_type", id="not-multipart"
        ),
        pytest.param(
            {"files": {"other": ("a.csv", b"x")}, "data": {"conversation_id": "c"}},
            400,
            "bad_request",
            id="no-file-field",
        ),
        pytest.param(
            {"files": {"file": ("a.csv", b"x")}}, 400, "bad_request", id="no-conversation"
        ),
        pytest.param(
            {
                "files": {"file": ("a.csv", b"x")},
                "data": {"conversation_id": "c", "subdir": "other"},
            },
            400,
            "invalid_subdir",
            id="bad-subdir",
        ),
        pytest.param(
            {
                "content": b"--x\r\ngarbage",
                "headers": {"Content-Type": "multipart/form-data; boundary=x"},
            },
            400,
            "bad_request",
            id="truncated-multipart",
        ),
    ],
)
def test_bad_upload_requests_get_clear_4xx(api, session_url, kwargs, status, code):
    r = api.post(f"{session_url}/files/upload", **kwargs)
    assert r.status_code == status, r.text
    assert r.json()["error"]["code"] == code
    assert r.json()["error"]["message"]
    assert_no_staged_files(workspace_of(api, session_url))


def test_list_without_conversation_covers_the_session(api, session_url):
    upload(api, session_url, "c1", "a.csv", b"a")
    upload(api, session_url, "c2", "b.csv", b"b")
    r = api.get(f"{session_url}/files")
    assert r.status_code == 200, r.text
    assert "conversation_id" not in r.json()
    assert sorted(r.json()["files"]) == ["a.csv", "b.csv"]  # names, as seed 000 §6.3
    assert sorted((f["conversation_id"], f["name"]) for f in r.json()["items"]) == [
        ("c1", "a.csv"),
        ("c2", "b.csv"),
    ]
    r = api.get(f"{session_url}/files", params={"conversation_id": "c1", "subdir": "../x"})
    assert r.status_code == 422 and "subdir" in r.json()["error"]["message"]


def test_other_users_session_is_404_everywhere(api, dev_server, session_url, user):
    upload(api, session_url, "c", "secret.csv", b"alice's")
    with httpx.Client(
        base_url=dev_server.url, headers={"X-User-Id": f"{user}-other"}, timeout=30
    ) as mallory:
        attempts = [
            mallory.get(session_url),
            mallory.get(f"{session_url}/files", params={"conversation_id": "c"}),
            mallory.get(f"{session_url}/files/secret.csv", params={"conversation_id": "c"}),
            mallory.delete(f"{session_url}/files/secret.csv", params={"conversation_id": "c"}),
            mallory.delete(f"{session_url}/conversations/c"),
            mallory.delete(session_url),
            upload(mallory, session_url, "c", "x.csv", b"x"),
        ]
    for r in attempts:
        assert r.status_code == 404, (r.request.method, r.request.url, r.text)
        assert "secret" not in r.text and "alice's" not in r.text
    assert [f["name"] for f in listing(api, session_url, "c")] == ["secret.csv"]


def test_other_conversation_is_404_or_refused(api, session_url):
    path = upload(api, session_url, "conv-a", "a.csv", b"only a").json()["path"]
    r = api.get(f"{session_url}/files/a.csv", params={"conversation_id": "conv-b"})
    assert r.status_code == 404
    r = api.get(f"{session_url}/files/{path}", params={"conversation_id": "conv-b"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "conversation_mismatch"
    r = api.delete(f"{session_url}/files/a.csv", params={"conversation_id": "conv-b"})
    assert r.status_code == 404
    assert listing(api, session_url, "conv-b") == []


def test_concurrent_uploads_to_the_users_cap_land_intact(dev_server, user, session_url):
    """As many uploads at once as one user may have in progress (QUOTAS__UPLOADS_PER_USER,
    32 by default: one more would be 429) all land, each whole."""
    payloads = {f"file-{i:02d}.csv": os.urandom(20_000 + i) for i in range(32)}

    async def run() -> list[httpx.Response]:
        async with httpx.AsyncClient(
            base_url=dev_server.url, headers={"X-User-Id": user}, timeout=120
        ) as client:
            await client.post(
                "/api/v1/sessions", json={"config": {"file_upload_config": {"max_file_count": 100}}}
            )
            return await asyncio.gather(
                *(
                    client.post(
                        f"{session_url}/files/upload",
                        files={"file": (name, data)},
                        data={"conversation_id": "busy"},
                    )
                    for name, data in payloads.items()
                )
            )

    responses = asyncio.run(run())
    assert [r.status_code for r in responses] == [201] * 32
    with httpx.Client(base_url=dev_server.url, headers={"X-User-Id": user}) as api:
        listed = {f["name"]: f["sha256"] for f in listing(api, session_url, "busy")}
    assert listed == {n: hashlib.sha256(d).hexdigest() for n, d in payloads.items()}
    for r in responses:
        body = r.json()
        assert hashlib.sha256(Path(body["path"]).read_bytes()).hexdigest() == body["sha256"]


def test_agent_outputs_download_by_full_path_but_never_list(api, session_url):
    made = execute(
        api,
        session_url,
        "mkdir -p outputs/charts && printf 'total,3' > outputs/charts/sum.csv",
        cid="c-out",
        language="bash",
    )
    assert made["exit_code"] == 0
    workspace = api.get(session_url).json()["workspace_path"]
    got = api.get(f"{session_url}/files/{workspace}/c-out/outputs/charts/sum.csv")
    assert got.status_code == 200 and got.content == b"total,3"
    assert got.headers["content-type"].startswith("text/csv")
    assert listing(api, session_url, "c-out") == []
    for bad in (
        "outputs/../uploads/temparea/x",
        "outputs/charts/%2E%2E/sum.csv",
        "outputs/missing.csv",
    ):
        r = api.get(f"{session_url}/files/{workspace}/c-out/{bad}")
        assert r.status_code in (400, 404), (bad, r.text)
    r = api.delete(f"{session_url}/files/{workspace}/c-out/outputs/charts/sum.csv")
    assert r.status_code == 400, "outputs cannot be deleted through the files API"


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        pytest.param({"conversation_id": ["c1", "c2"]}, "conversation_id", id="cid"),
        pytest.param(
            {"conversation_id": "c", "subdir": ["temparea", "temparea"]},
            "subdir",
            id="subdir",
        ),
    ],
)
def test_a_repeated_form_field_is_a_400_naming_it(api, session_url, fields, field):
    """Without a store the runtime reads the form itself: a small field sent twice is
    refused, not resolved to one of its values (the last one counted before)."""
    r = api.post(f"{session_url}/files/upload", data=fields, files={"file": ("a.csv", b"x")})
    assert r.status_code == 400, r.text
    assert f"form field '{field}' was sent more than once" in r.json()["error"]["message"]
    assert_no_staged_files(workspace_of(api, session_url))
    for cid in ("c", "c1", "c2"):
        listing = api.get(f"{session_url}/files", params={"conversation_id": cid})
        assert listing.json()["files"] == [], listing.text


def test_a_repeated_field_no_route_reads_is_ignored(api, session_url):
    """The document allows fields beyond the declared ones, and they are ignored: sent
    twice too (the contract fuzzer sent an extra field as a list, i.e. repeated)."""
    r = api.post(
        f"{session_url}/files/upload",
        data={"conversation_id": "c", "extra": ["x", "y"]},
        files={"file": ("a.csv", b"x")},
    )
    assert r.status_code == 201, r.text
