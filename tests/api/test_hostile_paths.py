"""The hostile-path corpus against real processes: nothing is read, written or deleted outside.

Two layers are attacked:
- the runtime (``runtime`` fixture) with hostile file names (multipart ``filename``) and
  conversation ids (form field, query, URL segment), and with symlinks that "sandbox
  code" planted inside the workspace pointing out of it;
- the API (``api`` fixture) with full sandbox paths, bare names and conversation ids.

Each case must be refused with 400 or 404 (never 2xx, never 500), and afterwards the
canary directory beside the workspace is byte-for-byte unchanged, its content never
appears in a response, and nothing new exists outside the workspace.

URL segments are percent-encoded *including dots*: httpx removes ``.``/``..`` path
segments before sending, so a literal ``..`` would never reach the server.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest
from hostile_ids import API_HOSTILE_CONVERSATION_IDS

CANARY = "CANARY-outside-the-workspace-7f3a"
PASSWD_MARK = "root:x:0:0"
OUTSIDE = "@OUTSIDE@"  # replaced by the canary directory's absolute path

# Names that must be refused wherever a file name or conversation id is accepted.
HOSTILE = [
    # traversal
    pytest.param("..", id="dot-dot"),
    pytest.param(".", id="dot"),
    pytest.param("../escape.txt", id="parent"),
    pytest.param("../../escape.txt", id="grandparent"),
    pytest.param("../../../../outside/planted.txt", id="into-canary-dir"),
    pytest.param("a/../../escape.txt", id="down-then-up"),
    pytest.param("./keep.txt", id="dot-slash"),
    pytest.param("a/b", id="slash"),
    pytest.param("..\\escape.txt", id="backslash-parent"),
    pytest.param("..\\..\\outside\\planted.txt", id="backslash-into-canary-dir"),
    pytest.param("a\\b", id="backslash"),
    pytest.param("C:\\x\\..", id="windows-path-to-dot-dot"),
    # absolute
    pytest.param("/etc/passwd", id="abs-etc-passwd"),
    pytest.param("//etc/passwd", id="abs-double-slash"),
    pytest.param(f"{OUTSIDE}/planted.txt", id="abs-into-canary-dir"),
    # NUL
    pytest.param("a\x00b.txt", id="nul"),
    pytest.param("\x00", id="nul-only"),
    pytest.param("..\x00.txt", id="dot-dot-nul"),
    pytest.param("keep.txt\x00.png", id="nul-truncation"),
    # control characters
    pytest.param("a\nb", id="newline"),
    pytest.param("a\rb", id="carriage-return"),
    pytest.param("a\tb", id="tab"),
    pytest.param("\x1b[2Jx", id="escape-sequence"),
    pytest.param("a\x7fb", id="del"),
    pytest.param("a\x85b", id="c1-next-line"),
    # invisible formatting
    pytest.param("\u202egnp.exe", id="rtl-override"),
    pytest.param("a\u200db", id="zero-width-joiner"),
    pytest.param("\u200bkeep.txt", id="zero-width-space"),
    pytest.param("\ufeffkeep.txt", id="byte-order-mark"),
    pytest.param("a\u00adb", id="soft-hyphen"),
    pytest.param("a\u2028b", id="line-separator"),
    # spaces that look like something else
    pytest.param("a\u00a0b", id="no-break-space"),
    pytest.param("a\u3000b", id="ideographic-space"),
    pytest.param(" keep.txt", id="leading-space"),
    pytest.param("keep.txt ", id="trailing-space"),
    pytest.param(" ", id="space-only"),
    # Unicode lookalikes that normalise (NFKC) into separators or dot-dot
    pytest.param("\u2025", id="two-dot-leader"),
    pytest.param("\u2024\u2024", id="one-dot-leaders"),
    pytest.param("\uff0e\uff0e", id="fullwidth-dots"),
    pytest.param(".\uff0e", id="mixed-dots"),
    pytest.param("\ufe52\ufe52", id="small-dots"),
    pytest.param("a\uff0fb", id="fullwidth-solidus"),
    pytest.param("a\uff3cb", id="fullwidth-reverse-solidus"),
    pytest.param("\uff0e\uff0e\uff0foutside\uff0fplanted.txt", id="fullwidth-traversal"),
    pytest.param("\u2025\uff0f\u2025\uff0f\u2025\uff0foutside", id="leader-traversal"),
    # overlong
    pytest.param("a" * 256, id="256-bytes"),
    pytest.param("数" * 86, id="258-bytes-cjk"),
    pytest.param("😀" * 64, id="256-bytes-emoji"),
    pytest.param("a" * 3000, id="3000-bytes"),
]

# Conversation ids additionally may not start with "." (the runtime's own state).
HOSTILE_CONVERSATION_IDS = [
    *HOSTILE,
    pytest.param(".runtime", id="runtime-state-dir"),
    pytest.param(".meta", id="dot-meta"),
    pytest.param(".hidden", id="dotfile"),
]


def seg(value: str) -> str:
    """One URL path segment, with dots encoded so that no client rewrites ``..``."""
    return quote(value, safe="").replace(".", "%2E")


def meta_file_name(name: str) -> str:
    """The metadata file name the runtime uses for an upload (see runtime/workspace.py)."""
    return hashlib.sha256(name.encode()).hexdigest()[:40] + ".json"


def fake_meta(name: str, size: int = len(CANARY)) -> str:
    return json.dumps(
        {
            "name": name,
            "size": size,
            "sha256": hashlib.sha256(CANARY.encode()).hexdigest(),
            "mime_type": "text/plain",
            "uploaded_at": "2024-01-01T00:00:00+00:00",
        }
    )


def multipart(file_name: str, data: bytes, fields: dict[str, str]) -> tuple[bytes, str]:
    """A multipart body carrying ``file_name`` byte-for-byte (httpx would escape it)."""
    boundary = b"hostile-boundary-0f9e8d"
    out = bytearray()
    for key, value in fields.items():
        out += b"--" + boundary + b"\r\n"
        out += f'Content-Disposition: form-data; name="{key}"\r\n\r\n'.encode()
        out += value.encode("utf-8") + b"\r\n"
    out += b"--" + boundary + b"\r\n"
    out += b'Content-Disposition: form-data; name="file"; filename="'
    out += file_name.encode("utf-8") + b'"\r\n'
    out += b"Content-Type: application/octet-stream\r\n\r\n" + data + b"\r\n"
    out += b"--" + boundary + b"--\r\n"
    return bytes(out), f"multipart/form-data; boundary={boundary.decode()}"


def tree(path: Path, *, skip: Path | None = None) -> dict[str, str | None]:
    """Every entry beneath ``path`` (links not followed) → file content (None: not a file).

    ``skip`` is left out; log files are listed but their growing content is not compared.
    """
    out: dict[str, str | None] = {}
    for dirpath, dirnames, filenames in os.walk(path):
        if skip is not None:
            dirnames[:] = [d for d in dirnames if Path(dirpath, d) != skip]
        for n in dirnames + filenames:
            p = Path(dirpath, n)
            rel = str(p.relative_to(path))
            if p.is_symlink():
                out[rel] = "-> " + os.readlink(p)
            elif p.is_file() and not n.endswith(".log"):
                out[rel] = p.read_bytes().decode(errors="replace")
            else:
                out[rel] = None
    return out


def assert_refused(r: httpx.Response, allowed: set[int]) -> None:
    assert r.status_code in allowed, (r.request.method, r.request.url, r.status_code, r.text)
    assert r.json()["error"]["code"], r.text
    assert CANARY not in r.text
    assert PASSWD_MARK not in r.text


def assert_no_leak(r: httpx.Response) -> None:
    assert r.status_code != 500, (r.request.method, r.request.url, r.text)
    assert CANARY not in r.text, (r.request.method, r.request.url, r.status_code)
    assert PASSWD_MARK not in r.text, (r.request.method, r.request.url, r.status_code)


# -- the runtime ------------------------------------------------------------------------------


@dataclass
class Scene:
    """A running runtime with one legitimate upload and a canary directory beside it."""

    client: httpx.Client
    root: Path
    base: Path  # the runtime's tmp dir: root, canary dir, server log and port file
    outside: Path

    def expand(self, value: str) -> str:
        return value.replace(OUTSIDE, str(self.outside))

    def upload(self, file_name: str, cid: str = "c1", data: bytes = b"new data") -> httpx.Response:
        body, content_type = multipart(file_name, data, {"conversation_id": cid})
        return self.client.post("/v1/uploads", content=body, headers={"content-type": content_type})

    def uploads_dir(self, cid: str = "c1") -> Path:
        return self.root / cid / "uploads" / "temparea"

    def meta_dir(self, cid: str = "c1") -> Path:
        return self.root / ".runtime" / "meta" / cid

    def listed(self, cid: str = "c1") -> list[str]:
        r = self.client.get(f"/v1/conversations/{seg(cid)}/uploads")
        assert r.status_code == 200, r.text
        assert CANARY not in r.text
        return [f["name"] for f in r.json()["files"]]

    def outside_state(self) -> dict[str, str | None]:
        return tree(self.base, skip=self.root)

    def staging(self) -> list[str]:
        return os.listdir(self.root / ".runtime" / "staging")


@pytest.fixture
def scene(runtime, tmp_path: Path) -> Scene:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text(CANARY)
    s = Scene(client=runtime.client, root=runtime.root, base=tmp_path, outside=outside)
    r = s.upload("keep.txt", data=b"keep me")
    assert r.status_code == 201, r.text
    # The fake metadata planted below must look exactly like the runtime's own.
    assert (s.meta_dir() / meta_file_name("keep.txt")).is_file()
    return s


def assert_contained(s: Scene, before: dict[str, str | None]) -> None:
    """Nothing outside changed, the workspace holds only what it held, staging is empty."""
    assert s.outside_state() == before
    assert sorted(os.listdir(s.root)) == [".runtime", "c1"]
    assert os.listdir(s.uploads_dir()) == ["keep.txt"]
    assert (s.uploads_dir() / "keep.txt").read_bytes() == b"keep me"
    assert os.listdir(s.meta_dir()) == [meta_file_name("keep.txt")]
    assert s.staging() == []


@pytest.mark.parametrize("name", HOSTILE)
def test_runtime_refuses_hostile_file_name_everywhere(scene: Scene, name: str) -> None:
    """Upload (multipart filename), download and delete all refuse; nothing escapes."""
    name = scene.expand(name)
    before = scene.outside_state()

    r = scene.upload(name)
    assert_refused(r, {400})

    # In a URL a decoded "/" splits the segment and no route matches: 404. Otherwise the
    # name reaches the name check: 400.
    expected = 404 if "/" in name else 400
    for method in ("GET", "DELETE"):
        r = scene.client.request(method, f"/v1/conversations/c1/uploads/{seg(name)}")
        assert_refused(r, {expected})

    assert scene.listed() == ["keep.txt"]
    assert_contained(scene, before)


@pytest.mark.parametrize("cid", HOSTILE_CONVERSATION_IDS)
def test_runtime_refuses_hostile_conversation_id_everywhere(scene: Scene, cid: str) -> None:
    """Upload (form field and query), info, create, list, download, delete all refuse."""
    cid = scene.expand(cid)
    before = scene.outside_state()

    r = scene.upload("ok.txt", cid=cid)
    assert_refused(r, {400})
    body, content_type = multipart("ok.txt", b"data", {})
    r = scene.client.post(
        "/v1/uploads",
        content=body,
        params={"conversation_id": cid},
        headers={"content-type": content_type},
    )
    assert_refused(r, {400})

    expected = 404 if "/" in cid else 400
    c = seg(cid)
    for method, url in [
        ("PUT", f"/v1/conversations/{c}"),
        ("GET", f"/v1/conversations/{c}"),
        ("DELETE", f"/v1/conversations/{c}"),
        ("GET", f"/v1/conversations/{c}/uploads"),
        ("GET", f"/v1/conversations/{c}/uploads/keep.txt"),
        ("DELETE", f"/v1/conversations/{c}/uploads/keep.txt"),
    ]:
        assert_refused(scene.client.request(method, url), {expected})

    assert scene.listed() == ["keep.txt"]
    assert_contained(scene, before)


@pytest.mark.parametrize(
    ("sent", "stored"),
    [
        pytest.param("%2e%2e%2fescape.txt", "%2e%2e%2fescape.txt", id="percent-encoded-traversal"),
        pytest.param("..%2f..%2fescape.txt", "..%2f..%2fescape.txt", id="half-encoded"),
        pytest.param("...", "...", id="three-dots"),
        pytest.param("..a", "..a", id="dot-dot-prefix"),
        pytest.param("C:\\x\\evil.txt", "evil.txt", id="windows-path-basename"),
        pytest.param("\u2215etc\u2215passwd", "\u2215etc\u2215passwd", id="division-slash"),
    ],
)
def test_runtime_stores_lookalike_names_literally_inside_temparea(
    scene: Scene, sent: str, stored: str
) -> None:
    """Control case: odd-but-harmless names land in temparea under their literal name."""
    before = scene.outside_state()
    r = scene.upload(sent, data=b"literal")
    assert r.status_code == 201, r.text
    assert r.json()["name"] == stored
    assert r.json()["path"] == f"{scene.root}/c1/uploads/temparea/{stored}"
    assert (scene.uploads_dir() / stored).read_bytes() == b"literal"
    assert sorted(os.listdir(scene.uploads_dir())) == sorted(["keep.txt", stored])
    assert scene.outside_state() == before
    r = scene.client.get(f"/v1/conversations/c1/uploads/{seg(stored)}")
    assert r.status_code == 200 and r.content == b"literal"


# -- symlinks planted inside the workspace by sandbox code -----------------------------------


def _mirror(outside: Path, *, meta: bool = True) -> Path:
    """An outside directory shaped like a conversation, with a canary upload and metadata."""
    conv = outside / "conv"
    (conv / "uploads" / "temparea").mkdir(parents=True)
    (conv / "uploads" / "temparea" / "secret.txt").write_text(CANARY)
    (conv / "uploads" / "temparea" / "keep.txt").write_text(CANARY)
    (conv / "outputs").mkdir()
    if meta:
        (conv / "uploads" / ".meta").mkdir()
        for n in ("secret.txt", "keep.txt"):
            (conv / "uploads" / ".meta" / meta_file_name(n)).write_text(fake_meta(n))
    return conv


def _replace_with_link(path: Path, target: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    path.symlink_to(target, target_is_directory=True)


def _every_operation(s: Scene, cid: str) -> Iterator[httpx.Response]:
    """Each operation in turn, lazily, so a failure names the first one that misbehaved."""
    c = seg(cid)
    yield s.client.get(f"/v1/conversations/{c}/uploads")
    yield s.client.get(f"/v1/conversations/{c}/uploads/secret.txt")
    yield s.client.get(f"/v1/conversations/{c}/uploads/keep.txt")
    yield s.upload("new.txt", cid=cid)
    yield s.upload("secret.txt", cid=cid)
    yield s.client.delete(f"/v1/conversations/{c}/uploads/secret.txt")
    yield s.client.delete(f"/v1/conversations/{c}/uploads/keep.txt")
    yield s.client.get(f"/v1/conversations/{c}")
    yield s.client.put(f"/v1/conversations/{c}")


@pytest.mark.parametrize(
    "component",
    [
        pytest.param((), id="conversation-dir"),
        pytest.param(("uploads",), id="uploads-dir"),
        pytest.param(("uploads", "temparea"), id="temparea"),
        pytest.param(("uploads", ".meta"), id="meta-dir"),
        pytest.param(("outputs",), id="outputs-dir"),
    ],
)
def test_symlinked_workspace_directory_never_leads_outside(
    scene: Scene, component: tuple[str, ...]
) -> None:
    """Whichever directory is swapped for a link out, no operation touches the target."""
    mirror = _mirror(scene.outside)
    _replace_with_link(scene.root / "c1" / Path(*component), mirror / Path(*component))
    before = scene.outside_state()

    for r in _every_operation(scene, "c1"):
        assert_no_leak(r)
        assert r.status_code in {200, 201, 204, 400, 404}, (r.request.url, r.text)
        assert scene.outside_state() == before

    r = scene.client.delete("/v1/conversations/c1")
    assert r.status_code == 200, r.text
    assert not (scene.root / "c1").exists() and not (scene.root / "c1").is_symlink()
    assert scene.outside_state() == before
    assert (mirror / "uploads" / "temparea" / "secret.txt").read_text() == CANARY
    assert scene.staging() == []


def test_temparea_symlink_to_outside(scene: Scene) -> None:
    """temparea → outside dir: uploads are refused, reads and deletes never reach it."""
    (scene.outside / "keep.txt").write_text(CANARY)
    _replace_with_link(scene.uploads_dir(), scene.outside)
    before = scene.outside_state()

    assert_refused(scene.upload("new.txt"), {400})
    assert_refused(scene.upload("keep.txt"), {400})
    assert_refused(scene.client.get("/v1/conversations/c1/uploads/keep.txt"), {400, 404})
    assert_refused(scene.client.delete("/v1/conversations/c1/uploads/keep.txt"), {400, 404})
    assert scene.listed() == []
    assert scene.outside_state() == before
    assert scene.staging() == []

    r = scene.client.delete("/v1/conversations/c1")
    assert r.status_code == 200, r.text
    assert not (scene.root / "c1").exists()
    assert scene.outside_state() == before


def test_conversation_dir_symlink_to_outside(scene: Scene) -> None:
    """{cid} → outside dir shaped like a conversation: nothing is served or written there."""
    mirror = _mirror(scene.outside)
    (scene.root / "c2").symlink_to(mirror, target_is_directory=True)
    before = scene.outside_state()

    assert scene.listed("c2") == []
    assert_refused(scene.client.get("/v1/conversations/c2/uploads/secret.txt"), {400, 404})
    assert_refused(scene.upload("new.txt", cid="c2"), {400})
    assert_refused(scene.client.delete("/v1/conversations/c2/uploads/secret.txt"), {400, 404})
    assert_refused(scene.client.put("/v1/conversations/c2"), {400})
    assert scene.outside_state() == before
    assert scene.staging() == []


def test_conversation_info_of_symlinked_conversation_is_not_a_server_error(scene: Scene) -> None:
    mirror = _mirror(scene.outside)
    (scene.root / "c2").symlink_to(mirror, target_is_directory=True)
    before = scene.outside_state()
    r = scene.client.get("/v1/conversations/c2")
    assert_no_leak(r)
    assert r.status_code in {200, 400, 404}, r.text
    if r.status_code == 200:
        assert r.json()["file_count"] == 0
    assert scene.outside_state() == before


def test_delete_symlinked_conversation_removes_only_the_link(scene: Scene) -> None:
    """DELETE of a conversation whose directory is a link out unlinks it, target intact."""
    mirror = _mirror(scene.outside)
    (scene.root / "c2").symlink_to(mirror, target_is_directory=True)
    before = scene.outside_state()

    r = scene.client.delete("/v1/conversations/c2")
    assert r.status_code == 200, r.text
    assert r.json()["exists"] is False
    assert not (scene.root / "c2").is_symlink()
    assert scene.outside_state() == before
    assert (mirror / "uploads" / "temparea" / "secret.txt").read_text() == CANARY
    assert scene.listed() == ["keep.txt"]


def test_conversation_dir_symlink_to_another_conversation(scene: Scene) -> None:
    """c2 → c1: c1's files are not reachable, deletable or deleted through c2."""
    (scene.root / "c2").symlink_to("c1", target_is_directory=True)

    assert scene.listed("c2") == []
    assert_refused(scene.client.get("/v1/conversations/c2/uploads/keep.txt"), {400, 404})
    assert_refused(scene.client.delete("/v1/conversations/c2/uploads/keep.txt"), {400, 404})
    assert_refused(scene.upload("new.txt", cid="c2"), {400})
    assert (scene.uploads_dir() / "keep.txt").read_bytes() == b"keep me"

    r = scene.client.delete("/v1/conversations/c2")
    assert r.status_code == 200, r.text
    assert not (scene.root / "c2").is_symlink()
    assert scene.listed("c1") == ["keep.txt"]
    assert (scene.uploads_dir() / "keep.txt").read_bytes() == b"keep me"


def test_upload_name_symlink_to_etc_passwd_is_never_served(scene: Scene) -> None:
    (scene.uploads_dir() / "passwd").symlink_to("/etc/passwd")
    (scene.meta_dir() / meta_file_name("passwd")).write_text(fake_meta("passwd"))
    passwd = Path("/etc/passwd").read_bytes()

    r = scene.client.get("/v1/conversations/c1/uploads/passwd")
    assert_refused(r, {400, 404})
    assert passwd not in r.content
    assert scene.listed() == ["keep.txt"]
    r = scene.client.get("/v1/conversations/c1")
    assert r.status_code == 200 and r.json()["file_count"] == 1  # keep.txt only
    assert Path("/etc/passwd").read_bytes() == passwd


def test_upload_name_symlink_to_outside_canary(scene: Scene) -> None:
    """A link named like an upload: never read; delete and re-upload replace the link only."""
    link = scene.uploads_dir() / "secret.txt"
    link.symlink_to(scene.outside / "secret.txt")
    (scene.meta_dir() / meta_file_name("secret.txt")).write_text(fake_meta("secret.txt"))
    before = scene.outside_state()

    assert_refused(scene.client.get("/v1/conversations/c1/uploads/secret.txt"), {400, 404})
    assert scene.listed() == ["keep.txt"]

    # Deleting the bogus entry may be refused or may remove the link; never the target.
    r = scene.client.delete("/v1/conversations/c1/uploads/secret.txt")
    assert r.status_code in {204, 400, 404}, r.text
    if r.status_code == 204:
        assert not link.is_symlink()
    assert scene.outside_state() == before

    link.unlink(missing_ok=True)
    link.symlink_to(scene.outside / "secret.txt")
    r = scene.upload("secret.txt", data=b"uploaded over the link")
    assert r.status_code == 201, r.text
    assert not link.is_symlink()
    assert link.read_bytes() == b"uploaded over the link"
    assert scene.outside_state() == before
    assert (scene.outside / "secret.txt").read_text() == CANARY


def test_meta_dir_symlink_to_outside(scene: Scene) -> None:
    """.runtime/meta/c1 → outside dir with fake metadata: the runtime answers from what it
    recorded (keep.txt, not the forged secret.txt), puts a real directory back in place of
    the link and writes nothing outside."""
    fake = scene.outside / "meta"
    fake.mkdir()
    for n in ("keep.txt", "secret.txt"):
        (fake / meta_file_name(n)).write_text(fake_meta(n))
    (scene.uploads_dir() / "secret.txt").write_text("inside but not an upload")
    _replace_with_link(scene.meta_dir(), fake)
    before = scene.outside_state()

    assert scene.listed() == ["keep.txt"]
    assert not scene.meta_dir().is_symlink() and scene.meta_dir().is_dir()
    assert_refused(scene.client.get("/v1/conversations/c1/uploads/secret.txt"), {404})
    r = scene.client.get("/v1/conversations/c1/uploads/keep.txt")
    assert r.status_code == 200 and r.content == b"keep me"
    assert scene.upload("new.txt").status_code == 201
    assert scene.listed() == ["keep.txt", "new.txt"]
    assert scene.outside_state() == before
    assert scene.staging() == []


def test_meta_file_symlink_to_outside_json(scene: Scene) -> None:
    """One metadata file swapped for a link to outside JSON: the upload is not trusted."""
    (scene.outside / "fake.json").write_text(fake_meta("secret.txt"))
    (scene.uploads_dir() / "secret.txt").write_text(CANARY)
    (scene.meta_dir() / meta_file_name("secret.txt")).symlink_to(scene.outside / "fake.json")
    before = scene.outside_state()

    assert scene.listed() == ["keep.txt"]
    assert_refused(scene.client.get("/v1/conversations/c1/uploads/secret.txt"), {404})
    assert_refused(scene.client.delete("/v1/conversations/c1/uploads/secret.txt"), {404})
    assert scene.outside_state() == before


def test_staging_symlink_to_outside_receives_nothing(scene: Scene) -> None:
    """.runtime/staging → outside: the runtime rebuilds its staging directory (removing the
    link, never following it) and the upload lands where it belongs."""
    _replace_with_link(scene.root / ".runtime" / "staging", scene.outside)
    before = scene.outside_state()
    r = scene.upload("new.txt", data=CANARY.encode() + b"-staged")
    assert r.status_code == 201, r.text
    assert scene.outside_state() == before
    assert (scene.uploads_dir() / "new.txt").read_bytes() == CANARY.encode() + b"-staged"
    staging = scene.root / ".runtime" / "staging"
    assert staging.is_dir() and not staging.is_symlink()


# -- the API ------------------------------------------------------------------------------------


@dataclass
class ApiScene:
    client: httpx.Client
    url: str  # the session's URL
    workspace: str  # the session's workspace path (a real directory: local backend)

    def files(self, cid: str) -> list[str]:
        r = self.client.get(f"{self.url}/files", params={"conversation_id": cid})
        assert r.status_code == 200, r.text
        return r.json()["files"]


def _upload(client: httpx.Client, url: str, cid: str, name: str, data: bytes) -> httpx.Response:
    return client.post(
        f"{url}/files/upload", files={"file": (name, data)}, data={"conversation_id": cid}
    )


@pytest.fixture
def api_scene(api: httpx.Client, session_url: str) -> ApiScene:
    for cid, name, data in (("c1", "keep.txt", b"keep me"), ("c2", "other.txt", b"other conv")):
        r = _upload(api, session_url, cid, name, data)
        assert r.status_code == 201, r.text
    workspace = api.get(session_url).json()["workspace_path"]
    assert Path(workspace, "c1", "uploads", "temparea", "keep.txt").is_file()
    return ApiScene(client=api, url=session_url, workspace=workspace)


def _assert_untouched(s: ApiScene) -> None:
    assert s.files("c1") == ["keep.txt"]
    assert s.files("c2") == ["other.txt"]
    assert sorted(os.listdir(s.workspace)) == [".runtime", "c1", "c2"]


HOSTILE_REFS = [
    pytest.param("{ws}/c1/uploads/temparea/../../../etc/passwd", id="traversal-to-etc-passwd"),
    pytest.param("{ws}/c1/uploads/temparea/../../../c2/uploads/temparea/other.txt", id="to-c2"),
    pytest.param("{ws}/c1/uploads/temparea/..", id="name-dot-dot"),
    pytest.param("{ws}/c1/uploads/temparea/.", id="name-dot"),
    pytest.param("{ws}/../uploads/temparea/keep.txt", id="conversation-dot-dot"),
    pytest.param("{ws}/./uploads/temparea/keep.txt", id="conversation-dot"),
    pytest.param("{ws}/../c1/uploads/temparea/keep.txt", id="parent-of-workspace"),
    pytest.param("{ws}/c1/../c1/uploads/temparea/keep.txt", id="up-and-down"),
    pytest.param("{ws}//c1/uploads/temparea/keep.txt", id="empty-component"),
    pytest.param("{ws}x/c1/uploads/temparea/keep.txt", id="sibling-prefix"),
    pytest.param("{ws}/c1/uploads/.meta/keep.txt", id="meta-dir"),
    pytest.param("{ws}/c1/outputs/keep.txt", id="outputs-dir"),
    pytest.param("{ws}/c1/uploads/temparea/keep.txt/..", id="trailing-dot-dot"),
    pytest.param("{ws}/c1/uploads/temparea/\uff0e\uff0e", id="fullwidth-dot-dot"),
    pytest.param("{ws}/c1/uploads/temparea/\u2025", id="two-dot-leader"),
    pytest.param("{ws}/c1/uploads/temparea/keep.txt\x00.png", id="nul"),
    pytest.param("{ws}/c1/uploads/temparea/..\\..\\..\\c2", id="backslashes"),
    pytest.param("{ws}/.runtime/uploads/temparea/keep.txt", id="runtime-state"),
    pytest.param("/etc/passwd", id="etc-passwd"),
    pytest.param("/c1/uploads/temparea/keep.txt", id="root-relative"),
    pytest.param("etc/passwd", id="relative-with-slash"),
    pytest.param("c1/uploads/temparea/keep.txt", id="workspace-relative"),
]


@pytest.mark.parametrize("method", ["GET", "DELETE"])
@pytest.mark.parametrize("ref", HOSTILE_REFS)
def test_api_download_and_delete_by_hostile_path(
    api_scene: ApiScene, ref: str, method: str
) -> None:
    """Full-path downloads and deletes outside the shape are 400/404, never 200 or 500."""
    s = api_scene
    path = ref.format(ws=s.workspace)
    r = s.client.request(method, f"{s.url}/files/{seg(path)}")
    assert_refused(r, {400, 404})
    assert b"keep me" not in r.content and b"other conv" not in r.content
    _assert_untouched(s)


@pytest.mark.parametrize(
    "name",
    [
        pytest.param("..", id="dot-dot"),
        pytest.param(".", id="dot"),
        pytest.param("\uff0e\uff0e", id="fullwidth-dot-dot"),
        pytest.param("a\\b", id="backslash"),
        pytest.param("keep.txt\x00", id="nul"),
        pytest.param("\u202ekeep.txt", id="rtl-override"),
        pytest.param(" keep.txt", id="leading-space"),
        pytest.param("a" * 256, id="256-bytes"),
    ],
)
@pytest.mark.parametrize("method", ["GET", "DELETE"])
def test_api_download_and_delete_by_hostile_bare_name(
    api_scene: ApiScene, name: str, method: str
) -> None:
    s = api_scene
    r = s.client.request(method, f"{s.url}/files/{seg(name)}", params={"conversation_id": "c1"})
    assert_refused(r, {400, 404})
    assert b"keep me" not in r.content
    _assert_untouched(s)


def test_api_delete_of_file_named_dot_dot_keeps_the_conversation(api_scene: ApiScene) -> None:
    """DELETE files/.. must not turn into a deletion of the conversation it names."""
    s = api_scene
    r = s.client.delete(f"{s.url}/files/{seg('..')}", params={"conversation_id": "c1"})
    assert Path(s.workspace, "c1", "uploads", "temparea", "keep.txt").is_file(), r.text
    assert_refused(r, {400, 404})
    _assert_untouched(s)


def test_api_path_of_another_conversation_with_mismatching_id(api_scene: ApiScene) -> None:
    s = api_scene
    url = f"{s.url}/files/{seg(f'{s.workspace}/c2/uploads/temparea/other.txt')}"
    for method in ("GET", "DELETE"):
        r = s.client.request(method, url, headers={"conversation_id": "c1"})
        assert_refused(r, {400, 404})
        assert b"other conv" not in r.content
    _assert_untouched(s)


def test_api_path_in_another_users_workspace(api_scene: ApiScene, dev_server, user: str) -> None:
    """User A naming user B's full sandbox path gets 400/404, never B's bytes."""
    other = f"{user}-b"
    other_url = f"/api/v1/sessions/sb-session-{other}"
    with httpx.Client(base_url=dev_server.url, headers={"X-User-Id": other}, timeout=60) as b:
        try:
            r = _upload(b, other_url, "c1", "keep.txt", b"user B secret")
            assert r.status_code == 201, r.text
            foreign = r.json()["path"]
            s = api_scene
            for method in ("GET", "DELETE"):
                r = s.client.request(method, f"{s.url}/files/{seg(foreign)}")
                assert_refused(r, {400, 404})
                assert b"user B secret" not in r.content
            assert Path(foreign).read_bytes() == b"user B secret"
            _assert_untouched(s)
        finally:
            b.delete(other_url)


@pytest.mark.parametrize("cid", API_HOSTILE_CONVERSATION_IDS)
def test_api_upload_with_hostile_conversation_id(api_scene: ApiScene, cid: str) -> None:
    s = api_scene
    r = s.client.post(
        f"{s.url}/files/upload", files={"file": ("ok.txt", b"x")}, data={"conversation_id": cid}
    )
    assert_refused(r, {400})
    r = s.client.post(
        f"{s.url}/files/upload", files={"file": ("ok.txt", b"x")}, params={"conversation_id": cid}
    )
    assert_refused(r, {400})
    _assert_untouched(s)


@pytest.mark.parametrize("cid", API_HOSTILE_CONVERSATION_IDS)
def test_api_list_download_delete_with_hostile_conversation_id(
    api_scene: ApiScene, cid: str
) -> None:
    s = api_scene
    params = {"conversation_id": cid}
    for method, url in [
        ("GET", f"{s.url}/files"),
        ("GET", f"{s.url}/files/keep.txt"),
        ("DELETE", f"{s.url}/files/keep.txt"),
        ("DELETE", f"{s.url}/conversations/{seg(cid)}"),
    ]:
        r = s.client.request(method, url, params=params if "/files" in url else None)
        assert_refused(r, {400, 404})
        _assert_untouched(s)


def test_api_delete_symlinked_conversation_removes_only_the_link(
    api_scene: ApiScene, tmp_path: Path
) -> None:
    """A conversation dir that sandbox code swapped for a link out: only the link goes."""
    s = api_scene
    outside = _mirror(tmp_path / "outside-dir")
    before = tree(tmp_path)
    Path(s.workspace, "c3").symlink_to(outside, target_is_directory=True)

    r = s.client.get(f"{s.url}/files/secret.txt", params={"conversation_id": "c3"})
    assert_refused(r, {400, 404})
    assert s.files("c3") == []

    r = s.client.delete(f"{s.url}/conversations/c3")
    assert r.status_code == 200, r.text
    assert r.json()["status"] == "deleted"
    assert not Path(s.workspace, "c3").is_symlink()
    assert tree(tmp_path) == before
    _assert_untouched(s)
