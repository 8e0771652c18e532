"""The runtime's state (``.runtime``) damaged every way we know, against a real process.

Damage is done by the test process, standing for code that ran unconfined or an old
PVC: executed code itself cannot reach ``.runtime`` once confined. Each case checks the
runtime starts, repairs what it can, never trusts what it cannot vouch for, and that
upload, list, download and execute still work afterwards.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import time
from pathlib import Path

import pytest
from runtime_ops import assert_healthy, execute, listed, make_unprivileged, restart

from sandbox_workspace.runtime import scratch
from sandbox_workspace.runtime.metastore import UploadMeta, meta_file_name

CANARY = b"CANARY-outside-7c1e"


def state(runtime) -> Path:
    return runtime.root / ".runtime"


def meta_dir(runtime, cid: str) -> Path:
    return state(runtime) / "meta" / cid


def temparea(runtime, cid: str) -> Path:
    return runtime.root / cid / "uploads" / "temparea"


def remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()


def download(runtime, cid: str, name: str):
    return runtime.client.get(f"/v1/conversations/{cid}/uploads/{name}")


def tree_of(path: Path) -> dict[str, bytes | str]:
    out: dict[str, bytes | str] = {}
    for dirpath, dirnames, filenames in os.walk(path):
        for n in dirnames + filenames:
            p = os.path.join(dirpath, n)
            if os.path.islink(p):
                out[p] = os.readlink(p)
            else:
                out[p] = Path(p).read_bytes() if os.path.isfile(p) else "dir"
    return out


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    d = tmp_path / "outside"
    d.mkdir()
    (d / "secret.txt").write_bytes(CANARY)
    return d


# -- .runtime replaced while the runtime runs ---------------------------------------------


def test_state_symlinked_to_a_conversation_heals_on_the_next_upload(runtime) -> None:
    """Today's failure: uploads answered 502 and the listing went empty. Now the link is
    removed (its target untouched), state is rebuilt from memory, nothing is lost."""
    assert runtime.upload("c1", "a.csv", b"a").status_code == 201
    assert runtime.upload("c2", "b.csv", b"b").status_code == 201
    remove(state(runtime))
    state(runtime).symlink_to("c1", target_is_directory=True)

    r = runtime.upload("c1", "new.csv", b"new")
    assert r.status_code == 201, r.text
    assert state(runtime).is_dir() and not state(runtime).is_symlink()
    assert sorted(os.listdir(runtime.root / "c1")) == ["outputs", "uploads"]
    assert sorted(os.listdir(temparea(runtime, "c1"))) == ["a.csv", "new.csv"]
    assert listed(runtime, "c1") == ["a.csv", "new.csv"]
    assert listed(runtime, "c2") == ["b.csv"]

    restart(runtime, signal.SIGKILL)  # what the repair wrote is what the next start reads
    assert listed(runtime, "c1") == ["a.csv", "new.csv"]
    assert listed(runtime, "c2") == ["b.csv"]
    assert download(runtime, "c1", "a.csv").content == b"a"
    assert_healthy(runtime)


def test_upload_in_flight_survives_its_staging_being_destroyed(runtime) -> None:
    """.runtime is replaced while an upload streams into staging: the upload still lands
    whole (staged again from the runtime's open descriptor), and nothing else is lost."""
    assert runtime.upload("c1", "a.csv", b"a").status_code == 201
    staging = state(runtime) / "staging"
    boundary = "in-flight-boundary"
    payload = b"0123456789" * 100_000

    def body():
        yield (
            f'--{boundary}\r\nContent-Disposition: form-data; name="conversation_id"\r\n\r\n'
            f'c1\r\n--{boundary}\r\nContent-Disposition: form-data; name="file"; '
            f'filename="big.bin"\r\n\r\n'
        ).encode() + payload[:500_000]
        deadline = time.monotonic() + 20
        while not (staging.is_dir() and os.listdir(staging)):
            assert time.monotonic() < deadline, "the upload never reached staging"
            time.sleep(0.01)
        remove(state(runtime))
        state(runtime).symlink_to("c1", target_is_directory=True)
        yield payload[500_000:] + f"\r\n--{boundary}--\r\n".encode()

    r = runtime.client.post(
        "/v1/uploads",
        content=body(),
        headers={"content-type": f"multipart/form-data; boundary={boundary}"},
    )
    assert r.status_code == 201, r.text
    assert r.json()["sha256"] == hashlib.sha256(payload).hexdigest()
    assert "staging it again" in runtime.server.log()  # the recovery path really ran
    assert (temparea(runtime, "c1") / "big.bin").read_bytes() == payload
    assert listed(runtime, "c1") == ["a.csv", "big.bin"]
    assert not state(runtime).is_symlink() and os.listdir(state(runtime) / "staging") == []
    assert sorted(os.listdir(runtime.root / "c1")) == ["outputs", "uploads"]
    restart(runtime, signal.SIGKILL)
    assert listed(runtime, "c1") == ["a.csv", "big.bin"]
    assert_healthy(runtime)


def test_listing_alone_heals_state_replaced_while_running(runtime, outside: Path) -> None:
    assert runtime.upload("c1", "a.csv", b"a").status_code == 201
    remove(state(runtime))
    state(runtime).symlink_to(outside, target_is_directory=True)
    before = tree_of(outside)

    assert listed(runtime, "c1") == ["a.csv"]
    assert not state(runtime).is_symlink()
    assert tree_of(outside) == before
    restart(runtime, signal.SIGKILL)
    assert listed(runtime, "c1") == ["a.csv"]
    assert_healthy(runtime)


def test_tampered_metadata_documents_are_rewritten_from_memory(runtime, outside: Path) -> None:
    """While running, memory is the authority: a document swapped for a link, a FIFO or a
    forgery is noticed on the next listing and rewritten; the next start agrees."""
    for name in ("a.csv", "b.csv", "c.csv"):
        assert runtime.upload("c1", name, name.encode()).status_code == 201
    docs = meta_dir(runtime, "c1")
    (outside / "forged.json").write_text('{"name": "a.csv"}')
    (docs / meta_file_name("a.csv")).unlink()
    (docs / meta_file_name("a.csv")).symlink_to(outside / "forged.json")
    (docs / meta_file_name("b.csv")).unlink()
    os.mkfifo(docs / meta_file_name("b.csv"))
    (docs / meta_file_name("c.csv")).write_text("garbage")

    assert listed(runtime, "c1") == ["a.csv", "b.csv", "c.csv"]
    restart(runtime, signal.SIGKILL)
    assert listed(runtime, "c1") == ["a.csv", "b.csv", "c.csv"]
    assert (outside / "forged.json").read_text() == '{"name": "a.csv"}'
    assert_healthy(runtime)


# -- damage done while the runtime was down ------------------------------------------------


def _state_to_symlink(rt, outside: Path) -> None:
    remove(state(rt))
    state(rt).symlink_to("c1", target_is_directory=True)


def _state_to_file(rt, outside: Path) -> None:
    remove(state(rt))
    state(rt).write_bytes(b"not a directory")


def _state_mode_000(rt, outside: Path) -> None:
    state(rt).chmod(0)


def _meta_mode_000(rt, outside: Path) -> None:
    meta_dir(rt, "c1").chmod(0)
    (state(rt) / "meta").chmod(0)


def _staging_fifo(rt, outside: Path) -> None:
    remove(state(rt) / "staging")
    os.mkfifo(state(rt) / "staging")


def _meta_to_outside(rt, outside: Path) -> None:
    shutil.move(state(rt) / "meta", outside / "meta")
    (state(rt) / "meta").symlink_to(outside / "meta", target_is_directory=True)


@pytest.mark.parametrize(
    ("damage", "kept"),
    [
        # The metadata itself was destroyed: the files stay, the runtime starts clean.
        pytest.param(_state_to_symlink, [], id="state-symlink-to-conversation"),
        pytest.param(_state_to_file, [], id="state-is-a-file"),
        pytest.param(_meta_to_outside, [], id="meta-symlink-to-outside"),
        # The metadata survived behind the damage: nothing is lost.
        pytest.param(_state_mode_000, ["a.csv"], id="state-mode-000"),
        pytest.param(_meta_mode_000, ["a.csv"], id="meta-mode-000"),
        pytest.param(_staging_fifo, ["a.csv"], id="staging-is-a-fifo"),
    ],
)
def test_restart_on_damaged_state_starts_and_heals(
    runtime, outside: Path, damage, kept, request
) -> None:
    """Today a restart on a PVC whose .runtime is a symlink refuses to start (a crash
    loop). Now every start succeeds, repairs, and follows no link."""
    make_unprivileged(runtime)  # mode 000 must mean something
    assert runtime.upload("c1", "a.csv", b"a").status_code == 201
    runtime.server.stop(signal.SIGKILL)
    # The damage may take the record of the killed runtime's scratch root with it: then
    # nothing knows the root any more but this test, which removes it.
    killed = scratch.recorded(runtime.root)
    request.addfinalizer(lambda: [scratch.remove_root(r) for r in killed])
    damage(runtime, outside)
    c1_before, outside_before = tree_of(runtime.root / "c1"), tree_of(outside)

    restart(runtime)
    for d in (state(runtime), state(runtime) / "meta", state(runtime) / "staging"):
        assert d.is_dir() and not d.is_symlink(), d
    assert tree_of(runtime.root / "c1") == c1_before
    assert tree_of(outside) == outside_before
    assert listed(runtime, "c1") == kept
    assert (temparea(runtime, "c1") / "a.csv").read_bytes() == b"a"
    assert_healthy(runtime)


def _forge(runtime, cid: str, doc_name: str, doc: dict | bytes) -> None:
    d = meta_dir(runtime, cid)
    d.mkdir(parents=True, exist_ok=True)
    data = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
    (d / doc_name).write_bytes(data)


def _doc(name: str, st: os.stat_result, data: bytes = b"") -> dict:
    meta = UploadMeta(
        name=name,
        size=st.st_size,
        sha256=hashlib.sha256(data).hexdigest(),
        mime_type="text/plain",
        uploaded_at="2024-01-01T00:00:00+00:00",
        ino=st.st_ino,
        ctime_ns=st.st_ctime_ns,
        mtime_ns=st.st_mtime_ns,
    )
    return json.loads(meta.to_bytes())


def test_forged_metadata_is_never_trusted(runtime, outside: Path) -> None:
    """Documents pointing at another conversation's file, outside, at a link, or at a
    file code wrote — and junk of every kind — are removed at start; the real upload and
    the neighbour's stay."""
    assert runtime.upload("c1", "a.csv", b"a").status_code == 201
    assert runtime.upload("c2", "other.csv", b"other").status_code == 201
    runtime.server.stop(signal.SIGTERM)
    ta = temparea(runtime, "c1")
    other = temparea(runtime, "c2") / "other.csv"
    (ta / "code.csv").write_bytes(b"written by code")
    (ta / "passwd").symlink_to("/etc/passwd")
    (ta / "sibling.csv").symlink_to(other)
    forged = {
        # names that try to leave the conversation
        "../../c2/uploads/temparea/other.csv": _doc("x", other.stat()),
        "/etc/passwd": _doc("x", os.stat("/etc/passwd")),
        # a name with no such file here, carrying the neighbour's inode
        "other.csv": _doc("other.csv", other.stat(), b"other"),
        # files that exist here but are not ours: links, a file code wrote
        "passwd": _doc("passwd", os.stat("/etc/passwd")),
        "sibling.csv": _doc("sibling.csv", other.stat(), b"other"),
        "code.csv": _doc("code.csv", os.stat("/etc/hostname")),
    }
    for name, doc in forged.items():
        _forge(runtime, "c1", meta_file_name(name), {**doc, "name": name})
    _forge(runtime, "c1", meta_file_name("junk.csv"), b"{not json")
    _forge(runtime, "c1", "not-a-hash.json", _doc("a.csv", (ta / "a.csv").stat(), b"a"))
    os.mkfifo(meta_dir(runtime, "c1") / meta_file_name("fifo.csv"))
    (meta_dir(runtime, "c1") / meta_file_name("dir.csv")).mkdir()
    (meta_dir(runtime, "c1") / meta_file_name("link.csv")).symlink_to(outside / "secret.txt")
    (state(runtime) / "meta" / ".hidden").mkdir()
    (state(runtime) / "meta" / "c3").write_text("not a directory")
    outside_before = tree_of(outside)

    restart(runtime)
    assert listed(runtime, "c1") == ["a.csv"]
    assert listed(runtime, "c2") == ["other.csv"]
    for name in ("other.csv", "passwd", "sibling.csv", "code.csv"):
        r = download(runtime, "c1", name)
        assert r.status_code == 404, (name, r.text)
    assert sorted(os.listdir(meta_dir(runtime, "c1"))) == [meta_file_name("a.csv")]
    assert sorted(os.listdir(state(runtime) / "meta")) == ["c1", "c2"]
    assert tree_of(outside) == outside_before
    assert other.read_bytes() == b"other"
    assert_healthy(runtime)


# -- what code does to an upload -----------------------------------------------------------

REPLACING_CODE = """
set -e
cd uploads/temparea
echo new > ../t && mv ../t r1.csv
echo other > ../o2 && ln -f ../o2 r2.csv
ln -sf /etc/passwd r3.csv
rm r4.csv && mkfifo r4.csv
printf more >> m1.csv
ln h1.csv ../../outputs/h1-link.csv
"""


def test_code_replacing_or_changing_uploads(runtime) -> None:
    """Another inode in an upload's place (new file, hard link, symlink, FIFO) is not the
    upload; one changed in place stays listed, honestly marked; a hard link of an upload
    leaves it the upload. The answers survive a restart."""
    runtime.server.env["SANDBOX_RUNTIME_MAX_FILE_COUNT"] = "20"
    restart(runtime)
    for name in ("r1.csv", "r2.csv", "r3.csv", "r4.csv", "m1.csv", "h1.csv"):
        assert runtime.upload("c1", name, b"orig").status_code == 201
    assert execute(runtime, "c1", REPLACING_CODE)["exit_code"] == 0

    for attempt in ("running", "restarted"):
        files = {
            f["name"]: f for f in runtime.client.get("/v1/conversations/c1/uploads").json()["files"]
        }
        assert sorted(files) == ["h1.csv", "m1.csv"], attempt
        assert files["m1.csv"]["modified"] is True and files["m1.csv"]["size"] == 8
        assert files["h1.csv"]["size"] == 4
        for name in ("r1.csv", "r2.csv", "r3.csv", "r4.csv"):
            r = download(runtime, "c1", name)
            assert r.status_code == 404 and b"root:" not in r.content, (name, r.text)
        r = download(runtime, "c1", "m1.csv")
        assert r.content == b"origmore" and "x-content-sha256" not in r.headers
        assert download(runtime, "c1", "h1.csv").content == b"orig"
        restart(runtime, signal.SIGKILL)

    assert runtime.client.delete("/v1/conversations/c1/uploads/r1.csv").status_code == 404
    assert (temparea(runtime, "c1") / "r1.csv").read_bytes() == b"new\n"  # code's file stays
    r = runtime.upload("c1", "r1.csv", b"again")
    assert r.status_code == 201 and r.json()["modified"] is False
    assert download(runtime, "c1", "r1.csv").headers["x-content-sha256"] == r.json()["sha256"]
    assert_healthy(runtime)


def test_restored_volume_keeps_uploads_whose_bytes_match(runtime) -> None:
    """A restore gives files new inodes: an upload whose bytes still hash to the recorded
    digest is recognised (and re-recorded); one whose bytes differ is not."""
    for name in ("same.csv", "changed.csv"):
        assert runtime.upload("c1", name, b"12345").status_code == 201
    runtime.server.stop(signal.SIGTERM)
    ta = temparea(runtime, "c1")
    for name, data in (("same.csv", b"12345"), ("changed.csv", b"54321")):
        (ta / "tmp").write_bytes(data)
        os.replace(ta / "tmp", ta / name)

    restart(runtime)
    files = runtime.client.get("/v1/conversations/c1/uploads").json()["files"]
    assert [(f["name"], f["modified"]) for f in files] == [("same.csv", False)]
    restart(runtime)  # re-recorded: recognised without hashing again, same answer
    assert listed(runtime, "c1") == ["same.csv"]
    assert_healthy(runtime)


# -- layout 1 ------------------------------------------------------------------------------


def _layout1_doc(name: str, data: bytes, size: int | None = None) -> str:
    return json.dumps(
        {
            "name": name,
            "size": len(data) if size is None else size,
            "sha256": hashlib.sha256(data).hexdigest(),
            "mime_type": "text/csv",
            "uploaded_at": "2024-01-01T00:00:00+00:00",
        }
    )


def test_layout_1_is_migrated_once_at_start(runtime, outside: Path) -> None:
    """A PVC written by the previous runtime: metadata in {cid}/uploads/.meta. Valid
    documents move to .runtime/meta; forged ones (size mismatch, link in temparea, junk)
    do not; a .meta link out is removed, not followed; it happens once."""
    runtime.server.stop(signal.SIGTERM)
    remove(state(runtime))
    (state(runtime) / "staging").mkdir(parents=True)
    (state(runtime) / "staging" / "upload-old.part").write_bytes(b"partial")
    ta = temparea(runtime, "c1")
    old = runtime.root / "c1" / "uploads" / ".meta"
    old.mkdir(parents=True)
    ta.mkdir(parents=True)
    for name, data in (("a.csv", b"a,b"), ("b.csv", b"bbb"), ("code.csv", b"code")):
        (ta / name).write_bytes(data)
    (ta / "link.csv").symlink_to(outside / "secret.txt")
    (old / meta_file_name("a.csv")).write_text(_layout1_doc("a.csv", b"a,b"))
    (old / meta_file_name("b.csv")).write_text(_layout1_doc("b.csv", b"bbb", size=99))
    (old / meta_file_name("link.csv")).write_text(_layout1_doc("link.csv", CANARY))
    (old / meta_file_name("junk.csv")).write_text("{")
    fake = outside / "meta"
    fake.mkdir()
    (fake / meta_file_name("secret.txt")).write_text(_layout1_doc("secret.txt", CANARY))
    (runtime.root / "c2" / "uploads" / "temparea").mkdir(parents=True)
    (runtime.root / "c2" / "uploads" / ".meta").symlink_to(fake, target_is_directory=True)
    outside_before = tree_of(outside)

    restart(runtime)
    assert listed(runtime, "c1") == ["a.csv"]
    assert listed(runtime, "c2") == []
    r = download(runtime, "c1", "a.csv")
    assert r.content == b"a,b"
    assert r.headers["x-content-sha256"] == hashlib.sha256(b"a,b").hexdigest()
    assert not os.path.lexists(old)
    assert not os.path.lexists(runtime.root / "c2" / "uploads" / ".meta")
    assert tree_of(outside) == outside_before
    assert (state(runtime) / "layout").read_bytes() == b"2"
    assert os.listdir(state(runtime) / "staging") == []

    # Once only: a .meta that code writes later is code's file, never migrated.
    old.mkdir()
    (old / meta_file_name("code.csv")).write_text(_layout1_doc("code.csv", b"code"))
    restart(runtime)
    assert listed(runtime, "c1") == ["a.csv"]
    assert_healthy(runtime)
