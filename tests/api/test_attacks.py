"""Attacks on the identity and file boundaries over HTTP (issue 33's review, read as an
attacker), against both file services: the embedded default (``dev``, seed 003's records
beside the sessions, ``CacheFiles``) and the object store (``StoredFiles``, SeaweedFS):

- guessing ids: another user's or another tenant's ``file_id``, conversation id and
  session id — the same user id in another tenant included — reach nothing, through every
  route that takes them (v1, seed 003's workspace and tenant routes), and change nothing;
- seed 003's ``path``: traversal, absolute, NUL, separators, a trailing slash, too long,
  before or after the file part — 400 ``invalid_path`` and nothing written; names that
  Unicode-normalise alike are one file (one record, one cache copy, one deletion);
- links agent code makes: an upload by ``path`` onto a link never writes through it, and a
  download by ``file_id`` of a file code replaced with a link never follows it.

Runs, replays and chat indexes across tenants: ``test_tenant_runs.py``."""

from __future__ import annotations

import secrets
import uuid

import httpx
import pytest
from api_calls import execute

pytestmark = pytest.mark.local_backend


@pytest.fixture(scope="module", params=["local", "s3"])
def server(request, start_server, tmp_path_factory):
    """A ``dev`` API of each file service (one per module: the tests use distinct users)."""
    if request.param == "local":
        return request.getfixturevalue("dev_server")
    seaweedfs = request.getfixturevalue("seaweedfs")
    bucket = f"t-{uuid.uuid4().hex[:12]}"
    seaweedfs.make_bucket(bucket)
    data = tmp_path_factory.mktemp("attacks") / "data"
    env = {"SANDBOX_WORKSPACE_SANDBOX_MOUNT": "none", **seaweedfs.env(bucket)}
    return start_server("dev", "--data-dir", str(data), **env)


@pytest.fixture
def api(server):
    user = f"u-{uuid.uuid4().hex[:10]}"
    with _client(server, user) as client:
        yield client
        client.delete(f"/api/v1/sessions/sb-session-{user}")


@pytest.fixture
def session_url(api) -> str:
    return f"/api/v1/sessions/sb-session-{api.headers['X-User-Id']}"


def _client(server, user: str, tenant: str | None = None) -> httpx.Client:
    headers = {"X-User-Id": user} | ({"X-Tenant-Id": tenant} if tenant else {})
    return httpx.Client(base_url=server.url, headers=headers, timeout=60)


@pytest.fixture
def victim(server):
    """acme's user 42 (made unique per test) with one file by seed 003 in conversation c1."""
    user = f"42-{uuid.uuid4().hex[:6]}"
    with _client(server, user, "acme") as api:
        r = api.post("/api/tenants/acme/workspace/c1/files", files={"file": ("secret.txt", b"S")})
        assert r.status_code == 201, r.text
        sid = api.get(f"/api/v1/sessions/sb-session-{user}").json()["session_id"]
        yield user, sid, r.json()["file_id"], api
        api.delete(f"/api/v1/sessions/{sid}")


def test_guessed_ids_of_another_user_or_tenant_reach_nothing(server, victim) -> None:
    user, sid, file_id, owner = victim
    attackers = [(user, "globex"), (user, None), (f"43-{user}", "acme")]  # same id elsewhere
    for name, tenant in attackers:
        with _client(server, name, tenant) as api:
            own = f"/api/v1/sessions/sb-session-{name}"
            assert api.post(f"{own}/workspace/c1", json={}).status_code in (404, 405)
            tenant_path = f"/api/tenants/{tenant or 'default'}/workspace/c1"
            for url in (
                f"/api/v1/sessions/{sid}/workspace/c1/files/{file_id}",  # the victim's session
                f"{own}/workspace/c1/files/{file_id}",  # the victim's file_id in one's own
                f"{tenant_path}/files/{file_id}",
                "/api/tenants/acme/workspace/c1/files/" + file_id,
            ):
                assert api.get(url).status_code == 404, (name, tenant, url)
                assert api.delete(url).status_code == 404, (name, tenant, url)
            for url in (f"/api/v1/sessions/{sid}/files/secret.txt", f"{own}/files/secret.txt"):
                r = api.get(url, params={"conversation_id": "c1"})
                assert r.status_code == 404, (name, tenant, url)
                r = api.delete(url, params={"conversation_id": "c1"})
                assert r.status_code == 404, (name, tenant, url)
            # The same conversation id in one's own session is one's own, empty.
            assert api.get(f"{own}/workspace/c1").json()["files"] == []
            api.delete(own)
    # Nothing of the victim's changed.
    got = owner.get(f"/api/tenants/acme/workspace/c1/files/{file_id}")
    assert got.status_code == 200 and got.content == b"S"


BAD_PATHS = [
    "../escape.txt",
    "/etc/evil.txt",
    "a\x00b.txt",
    "uploads/../outputs/x.txt",
    "../../c2/uploads/temparea/x.txt",
    "sub/x.txt",
    "x.txt/",
    "..",
    ".",
    "a\\b.txt",
    "x" * 256,
    "é" * 128 + ".txt",  # 261 bytes in UTF-8
    ".sbw/files.json",
    "\u2024\u2024",  # one-dot leaders: '..' under NFKC
    "x\u202e.txt",  # an invisible bidi override
]


def _form(path: str, *, path_first: bool) -> tuple[bytes, str]:
    b = secrets.token_hex(8)
    file = (f'--{b}\r\nContent-Disposition: form-data; name="file"; filename="f.txt"\r\n'
            "Content-Type: text/plain\r\n\r\nDATA\r\n").encode()  # fmt: skip
    field = (f'--{b}\r\nContent-Disposition: form-data; name="path"\r\n\r\n'.encode()
             + path.encode("utf-8", "surrogatepass") + b"\r\n")  # fmt: skip
    parts = [field, file] if path_first else [file, field]
    return b"".join(parts) + f"--{b}--\r\n".encode(), f"multipart/form-data; boundary={b}"


@pytest.mark.parametrize("path_first", [True, False], ids=["path-first", "path-after-file"])
def test_seed_003_paths_that_leave_temparea_are_refused_and_write_nothing(
    api, session_url, path_first
) -> None:
    seed = f"{session_url}/workspace/c1"
    for path in BAD_PATHS:
        body, content_type = _form(path, path_first=path_first)
        r = api.post(f"{seed}/files", content=body, headers={"Content-Type": content_type})
        assert r.status_code == 400, (path, r.status_code, r.text)
        assert r.json()["error"]["code"] in ("invalid_path", "invalid_file_name"), (path, r.text)
    assert api.get(seed).json()["files"] == []
    found = execute(api, session_url, "find . -type f | sort", cid="c1", language="bash")
    assert found["stdout"] == "", found  # nothing anywhere in the conversation
    outside = execute(api, session_url, "ls ../c2 ../escape.txt 2>&1 | wc -l", language="bash")
    assert "escape" not in outside["stdout"]


def test_names_that_normalise_alike_are_one_file(api, session_url) -> None:
    seed = f"{session_url}/workspace/c1"
    nfd, nfc = "cafe\u0301.txt", "caf\u00e9.txt"
    first = api.post(f"{seed}/files", files={"file": ("a", b"one")}, data={"path": nfd})
    assert first.status_code == 201, first.text
    second = api.post(f"{seed}/files", files={"file": ("b", b"two!")}, data={"path": nfc})
    assert second.status_code == 201, second.text
    one, two = first.json(), second.json()
    assert one["file_path"] == two["file_path"] == f"uploads/temparea/{nfc}"
    assert (two["file_id"], two["version"]) == (one["file_id"], 2)
    listing = api.get(f"{session_url}/files", params={"conversation_id": "c1"}).json()
    assert listing["files"] == [nfc]
    r = api.delete(f"{seed}/files/{one['file_id']}")
    assert r.status_code == 200, r.text
    assert api.get(f"{session_url}/files", params={"conversation_id": "c1"}).json()["files"] == []
    assert api.get(seed).json()["files"] == []


def test_links_agent_code_makes_are_never_followed_by_seed_003(api, session_url) -> None:
    seed = f"{session_url}/workspace/c1"
    # Another conversation's file, and a link to it where an upload by path will land.
    r = api.post(f"{session_url}/files/upload", files={"file": ("victim.txt", b"kept")},
                 data={"conversation_id": "c2"})  # fmt: skip
    assert r.status_code == 201, r.text
    link = "mkdir -p uploads/temparea && ln -s ../../../c2/uploads/temparea/victim.txt uploads/temparea/evil.txt"  # noqa: E501
    execute(api, session_url, link, cid="c1", language="bash")
    r = api.post(f"{seed}/files", files={"file": ("x", b"overwritten?")},
                 data={"path": "evil.txt"})  # fmt: skip
    assert r.status_code in (201, 400, 409), r.text  # replaced or refused: never followed
    got = api.get(f"{session_url}/files/victim.txt", params={"conversation_id": "c2"})
    assert got.content == b"kept"
    # A recorded file that code swaps for a link to a file outside: never served.
    r = api.post(f"{seed}/files", files={"file": ("x", b"mine")}, data={"path": "doc.txt"})
    assert r.status_code == 201, r.text
    file_id = r.json()["file_id"]
    swap = "rm uploads/temparea/doc.txt && ln -s /etc/passwd uploads/temparea/doc.txt"
    execute(api, session_url, swap, cid="c1", language="bash")
    got = api.get(f"{seed}/files/{file_id}")
    assert b"root:" not in got.content
    # The store serves the version it recorded; the workspace alone refuses the link.
    assert (got.status_code, got.content) == (200, b"mine") or got.status_code in (404, 409), (
        got.status_code,
        got.text,
    )
