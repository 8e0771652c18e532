"""Uploads in ``SANDBOX_WORKSPACE_STORE=s3`` mode (real SeaweedFS): one pass over the
body feeds the sandbox's cache and the store; seed 003's ``path`` and ``description``;
an upload the runtime refuses leaves no object behind."""

from __future__ import annotations

import hashlib

import httpx
import pytest

from .test_store_mode import manifest, objects

pytestmark = pytest.mark.local_backend

SID = "sb-session-up"


@pytest.fixture(scope="module")
def store_server(start_server, seaweedfs, tmp_path_factory):
    bucket = f"t-uploads-{tmp_path_factory.mktemp('b').name[-6:].lower()}"
    seaweedfs.make_bucket(bucket)
    env = {"SANDBOX_WORKSPACE_SANDBOX_MOUNT": "none", **seaweedfs.env(bucket)}
    data = tmp_path_factory.mktemp("data")
    server = start_server("dev", "--data-dir", str(data), **env)
    limits = {"max_file_count": 2, "allowed_file_types": ["txt", "csv"]}
    with httpx.Client(base_url=server.url, headers={"X-User-Id": "up"}, timeout=60) as api:
        r = api.post("/api/v1/sessions", json={"config": {"file_upload_config": limits}})
        assert r.status_code == 201, r.text
    return server, bucket


@pytest.fixture
def api(store_server):
    server, _ = store_server
    with httpx.Client(base_url=server.url, headers={"X-User-Id": "up"}, timeout=60) as client:
        yield client


def test_path_names_the_file_and_the_object_is_the_one_recorded(api, store_server, seaweedfs):
    _, bucket = store_server
    seed = f"/api/v1/sessions/{SID}/workspace/p1"
    body = b"a,b\n1,2\n" * 1000
    r = api.post(
        f"{seed}/files",
        data={"path": "table.csv", "description": "the table"},
        files={"file": ("export (3).csv", body)},
    )
    assert r.status_code == 201, r.text
    record = r.json()
    assert record["file_path"] == "uploads/temparea/table.csv"
    assert (record["original_name"], record["description"]) == ("export (3).csv", "the table")
    assert record["checksum"] == hashlib.sha256(body).hexdigest()
    # The cache has it at its path (the agent's view), the store at its key.
    listing = api.get(f"/api/v1/sessions/{SID}/files", params={"conversation_id": "p1"}).json()
    assert listing["files"] == ["table.csv"]
    doc = manifest(seaweedfs, bucket, SID, "p1")
    [stored] = [f for f in doc["files"] if f["file_id"] == record["file_id"]]
    key = f"workspaces/default/{SID}/p1/uploads/temparea/table.csv"
    assert key in objects(seaweedfs, bucket, f"workspaces/default/{SID}/p1/")
    assert stored["etag"]  # recorded from the tee's own put
    got = api.get(f"{seed}/files/{record['file_id']}")
    assert got.status_code == 200 and got.content == body

    # The same bytes again under that path are a new user_upload version.
    r = api.post(f"{seed}/files", data={"path": "table.csv"}, files={"file": ("x.csv", body)})
    assert r.status_code == 201, r.text
    assert (r.json()["file_id"], r.json()["version"]) == (record["file_id"], 2)


@pytest.mark.parametrize(
    ("path", "says"),
    [
        pytest.param("../secret.txt", "'..'", id="traversal"),
        pytest.param("a/../../x.txt", "'..'", id="traversal-inside"),
        pytest.param("uploads/temparea/x.txt", "flat", id="workspace-form"),
        pytest.param("/etc/passwd.txt", "relative", id="absolute"),
        pytest.param("a\x00b.txt", "NUL", id="nul"),
        pytest.param("x" * 252 + ".txt", "255 bytes", id="too-long"),
        pytest.param(".sbw/files.json", "reserved", id="reserved-metadata"),
        pytest.param("outputs/x.txt", "flat", id="outside-uploads"),
        pytest.param("sub/dir.txt", "flat", id="subdirectory"),
        pytest.param("a\\b.txt", "'\\'", id="backslash"),
        pytest.param("", "empty", id="empty"),
    ],
)
def test_a_bad_path_is_refused_with_a_message(api, store_server, seaweedfs, path, says):
    _, bucket = store_server
    r = api.post(
        f"/api/v1/sessions/{SID}/workspace/bad/files",
        data={"path": path},
        files={"file": ("fine.txt", b"x")},
    )
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["code"] == "invalid_path" and says in error["message"], error
    keys = objects(seaweedfs, bucket, f"workspaces/default/{SID}/bad/")
    assert not [k for k in keys if "/uploads/" in k]


def test_path_after_the_file_names_it_too(api):
    """A form may put `path` after the file (the schema cannot order parts): the runtime
    names the file by it, the store gets it by the write-back; a bad one is still 400."""
    boundary = "b0undary"
    url = f"/api/v1/sessions/{SID}/workspace/order/files"
    headers = {"content-type": f"multipart/form-data; boundary={boundary}"}

    def form(path: str) -> bytes:
        return (
            f'--{boundary}\r\nContent-Disposition: form-data; name="file"; '
            f'filename="a.txt"\r\n\r\nx\r\n--{boundary}\r\nContent-Disposition: '
            f'form-data; name="path"\r\n\r\n{path}\r\n--{boundary}--\r\n'
        ).encode()

    r = api.post(url, content=form("b.txt"), headers=headers)
    assert r.status_code == 201, r.text
    assert (r.json()["file_path"], r.json()["original_name"]) == ("uploads/temparea/b.txt", "b.txt")
    got = api.get(f"{url}/{r.json()['file_id']}")
    assert got.status_code == 200 and got.content == b"x"
    r = api.post(url, content=form("../c.txt"), headers=headers)
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_path", r.text
    listing = api.get(f"/api/v1/sessions/{SID}/files", params={"conversation_id": "order"})
    assert listing.json()["files"] == ["b.txt"]


def test_an_upload_the_runtime_refuses_leaves_no_object(api, store_server, seaweedfs):
    """The put runs beside the runtime's write; the object is completed only once the
    runtime committed: refused at the headers (type) or after the whole body (count),
    nothing is left in the store and a replaced file keeps its recorded bytes."""
    _, bucket = store_server
    url, cid = f"/api/v1/sessions/{SID}/files/upload", "refused"
    prefix = f"workspaces/default/{SID}/{cid}/uploads/temparea/"
    big = b"y" * (20 * 1024 * 1024)  # several parts of a multipart upload

    r = api.post(url, data={"conversation_id": cid}, files={"file": ("x.bin", big)})
    assert r.status_code == 415, r.text
    for name in ("one.txt", "two.txt"):
        r = api.post(url, data={"conversation_id": cid}, files={"file": (name, b"kept")})
        assert r.status_code == 201, r.text
    r = api.post(url, data={"conversation_id": cid}, files={"file": ("three.txt", big)})
    assert r.status_code == 409 and r.json()["error"]["code"] == "file_count_exceeded"
    assert objects(seaweedfs, bucket, prefix) == [prefix + "one.txt", prefix + "two.txt"]

    # A conversation given only after the file: copied from the cache afterwards.
    boundary = "late"
    body = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="late.txt"'
        f"\r\n\r\nlate\r\n--{boundary}\r\nContent-Disposition: form-data; "
        f'name="conversation_id"\r\n\r\nlate2\r\n--{boundary}--\r\n'
    ).encode()
    r = api.post(
        url, content=body, headers={"content-type": f"multipart/form-data; boundary={boundary}"}
    )
    assert r.status_code == 201, r.text
    doc = manifest(seaweedfs, bucket, SID, "late2")
    assert [(f["file_path"], f["file_size"]) for f in doc["files"]] == [
        ("uploads/temparea/late.txt", 4)
    ]


def test_deleting_by_file_id_removes_the_cache_copy_of_an_output(api, store_server, seaweedfs):
    """Delete by file_id reaches the sandbox's copy through the runtime (as in a pod,
    whose disk the API cannot see): an output goes from the store and from the cache;
    a link code planted at an output's place is removed, its target left alone."""
    _, bucket = store_server
    url, seed = f"/api/v1/sessions/{SID}", f"/api/v1/sessions/{SID}/workspace/outs"
    code = (
        "import os; os.makedirs('outputs/deep', exist_ok=True); "
        "open('outputs/deep/r.txt','w').write('result'); open('keep.txt','w').write('k'); "
        "os.symlink('../keep.txt', 'outputs/link.txt')"
    )
    r = api.post(
        f"{url}/execute", json={"conversation_id": "outs", "language": "python", "code": code}
    )
    assert r.status_code == 200 and r.json()["exit_code"] == 0, r.text
    files = {f["file_path"]: f for f in api.get(seed).json()["files"]}
    assert "outputs/deep/r.txt" in files, files
    r = api.delete(f"{seed}/files/{files['outputs/deep/r.txt']['file_id']}")
    assert r.status_code == 200 and r.json()["status"] == "deleted"
    state = api.get(f"{url}/conversations/outs").json()
    assert "deep/r.txt" not in [o["relative_path"] for o in state["outputs"]], state
    assert not [
        k
        for k in objects(seaweedfs, bucket, f"workspaces/default/{SID}/outs/")
        if k.endswith("r.txt")
    ]
    check = "import os; print(os.path.exists('outputs/deep/r.txt'), open('keep.txt').read())"
    r = api.post(
        f"{url}/execute", json={"conversation_id": "outs", "language": "python", "code": check}
    )
    assert r.json()["stdout"].split() == ["False", "k"], r.text


@pytest.mark.parametrize(
    ("after_file", "says"),
    [
        pytest.param(
            'Content-Disposition: form-data; name="file"; filename="b.txt"\r\n\r\nb\r\n',
            "one file per request",
            id="second-file",
        ),
        pytest.param("Content-Disposition form-data\r\n\r\nx\r\n", "malformed", id="malformed"),
        pytest.param(None, "closing boundary", id="no-closing-boundary"),
        pytest.param(
            'Content-Disposition: form-data; name="conversation_id"\r\n\r\nelsewhere\r\n',
            "disagree",
            id="another-conversation",
        ),
        pytest.param(
            'Content-Disposition: form-data; name="subdir"\r\n\r\n\udcff\r\n',
            "UTF-8",
            id="field-not-utf8",
        ),
    ],
)
def test_what_the_runtime_refuses_in_a_form_is_refused_when_sent_raw(
    api, store_server, seaweedfs, after_file, says
):
    """The teed upload reaches the runtime as the file's bytes and a trailer, not as the
    form: what the runtime would have refused in the form is refused on the way, in its
    words, and neither the cache nor the store keeps anything."""
    _, bucket = store_server
    cid = "raw-refused"
    boundary = "b0undary"
    body = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="a.txt"'
        f"\r\n\r\n{'a' * 300_000}\r\n--{boundary}"
    )
    if after_file is not None:
        body += f"\r\n{after_file}--{boundary}--\r\n"
    r = api.post(
        f"/api/v1/sessions/{SID}/workspace/{cid}/files",
        content=body.encode("utf-8", "surrogateescape"),
        headers={"content-type": f"multipart/form-data; boundary={boundary}"},
    )
    assert r.status_code == 400, r.text
    assert says in r.json()["error"]["message"], r.text
    listing = api.get(f"/api/v1/sessions/{SID}/files", params={"conversation_id": cid})
    assert listing.json()["files"] == []
    assert objects(seaweedfs, bucket, f"workspaces/default/{SID}/{cid}/uploads/") == []


def _form(parts: list[tuple[str, str | None, str]], boundary: str = "rep34t") -> bytes:
    """A multipart body of ``(field, filename, value)`` parts, in order."""
    body = ""
    for field, filename, value in parts:
        disposition = f'form-data; name="{field}"' + (
            f'; filename="{filename}"' if filename else ""
        )
        body += f"--{boundary}\r\nContent-Disposition: {disposition}\r\n\r\n{value}\r\n"
    return (body + f"--{boundary}--\r\n").encode()


REPEATED_FIELD_FORMS = [
    # What the contract fuzzer sent: `path` three times, one of them "[]" (stored as "[]").
    pytest.param(
        [
            ("path", None, "a.txt"),
            ("path", None, "[]"),
            ("path", None, "b.txt"),
            ("file", "f.txt", "x" * 1000),
        ],
        "path",
        id="path-thrice-before-the-file",
    ),
    pytest.param(
        [
            ("file", "f.txt", "x" * 300_000),
            ("description", None, "one"),
            ("description", None, "two"),
        ],
        "description",
        id="description-twice-after-the-file",
    ),
    pytest.param(
        [
            ("subdir", None, "temparea"),
            ("file", "f.txt", "x" * 300_000),
            ("subdir", None, "temparea"),
        ],
        "subdir",
        id="subdir-around-the-file",
    ),
]


@pytest.mark.parametrize("route", ["workspace", "tenant", "v1"])
@pytest.mark.parametrize(("parts", "field"), REPEATED_FIELD_FORMS)
def test_a_repeated_form_field_is_a_400_on_every_upload_route(
    api, store_server, seaweedfs, route, parts, field
):
    """A small field is single-valued: sent twice it is refused (400, naming the field),
    never one of its values picked — and nothing lands in the cache or the store."""
    _, bucket = store_server
    cid = f"repeated-{route}"
    url = {
        "workspace": f"/api/v1/sessions/{SID}/workspace/{cid}/files",
        "tenant": f"/api/tenants/default/workspace/{cid}/files",
        "v1": f"/api/v1/sessions/{SID}/files/upload?conversation_id={cid}",
    }[route]
    r = api.post(
        url, content=_form(parts), headers={"content-type": "multipart/form-data; boundary=rep34t"}
    )
    assert r.status_code == 400, r.text
    assert f"form field '{field}' was sent more than once" in r.json()["error"]["message"]
    listing = api.get(f"/api/v1/sessions/{SID}/files", params={"conversation_id": cid})
    assert listing.json()["files"] == []
    assert objects(seaweedfs, bucket, f"workspaces/default/{SID}/{cid}/uploads/") == []
