"""Snapshots, restores and forks of a conversation (issue 38), in both store modes: each
test runs against a ``local`` API (the workspace holds the files; the runtime copies them
on its volume) and an ``s3`` API on a real SeaweedFS (server-side copies), both with the
local backend and real executions.

The two servers run with small caps so the limits are reachable: 3 conversations per user,
300 kB of snapshots per user.
"""

from __future__ import annotations

import json
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import httpx
import pytest
from api_calls import execute
from hold_proxy import HoldProxy
from polling import wait_for

pytestmark = pytest.mark.local_backend

QUOTA = 300_000
CAPS = {
    "SANDBOX_WORKSPACE_QUOTAS__CONVERSATIONS_PER_USER": "3",
    "SANDBOX_WORKSPACE_QUOTAS__SNAPSHOT_BYTES_PER_USER": str(QUOTA),
    "SANDBOX_WORKSPACE_SANDBOX_MOUNT": "none",  # host paths: the test reads the disk
}


@dataclass
class Mode:
    name: str
    url: str
    seaweedfs: object = None
    bucket: str = ""

    def objects(self, sid: str, cid: str) -> list[str]:
        """s3: every key under the conversation's prefix."""
        prefix = f"workspaces/default/{sid}/{cid}/"
        return [i.key for i in self.seaweedfs.list_keys(self.bucket, prefix)]


@pytest.fixture(scope="module", params=["local", "s3"])
def mode(request, start_server) -> Mode:
    if request.param == "local":
        server = start_server("dev", "--data-dir", "data", **CAPS)
        return Mode("local", server.url)
    seaweedfs = request.getfixturevalue("seaweedfs")
    bucket = f"t-{uuid.uuid4().hex[:12]}"
    seaweedfs.make_bucket(bucket)
    server = start_server("dev", "--data-dir", "data", **CAPS, **seaweedfs.env(bucket))
    return Mode("s3", server.url, seaweedfs, bucket)


@pytest.fixture
def who(mode: Mode) -> Iterator[tuple[str, httpx.Client]]:
    user = f"u-{uuid.uuid4().hex[:10]}"
    with httpx.Client(base_url=mode.url, headers={"X-User-Id": user}, timeout=120) as api:
        yield user, api
        api.delete(f"/api/v1/sessions/sb-session-{user}")


def url(user: str, cid: str, *rest: str) -> str:
    return "/".join([f"/api/v1/sessions/sb-session-{user}/conversations/{cid}", *rest])


def run(api: httpx.Client, user: str, cid: str, code: str) -> str:
    result = execute(api, f"/api/v1/sessions/sb-session-{user}", code, cid=cid)
    assert result["exit_code"] == 0 and not result["error"], json.dumps(result)
    return result["stdout"]


def upload(api: httpx.Client, user: str, cid: str, name: str, data: bytes) -> None:
    r = api.post(
        f"/api/v1/sessions/sb-session-{user}/files/upload",
        files={"file": (name, data)},
        data={"conversation_id": cid},
    )
    assert r.status_code == 201, r.text


READ = """
import json, os
out = {}
for top in ("outputs", "uploads/temparea"):
    for d, _, names in os.walk(top):
        for n in names:
            p = os.path.join(d, n)
            st = os.stat(p)
            out[p] = [open(p).read(), st.st_ino, st.st_nlink]
print(json.dumps(out))
"""


def files(api, user, cid) -> dict[str, str]:
    return {p: v[0] for p, v in json.loads(run(api, user, cid, READ)).items()}


def inodes(api, user, cid) -> dict[str, tuple[int, int]]:
    return {p: (v[1], v[2]) for p, v in json.loads(run(api, user, cid, READ)).items()}


def test_restore_brings_back_exactly_the_snapshot_and_restarts_the_kernel(who, mode):
    user, api = who
    upload(api, user, "c1", "in.csv", b"a,b\n1,2\n")
    run(api, user, "c1", "x = 41\nopen('outputs/o.txt', 'w').write('v1')")
    r = api.post(url(user, "c1", "snapshots"), json={"name": "turn 1"})
    assert r.status_code == 201, r.text
    snap = r.json()
    assert (snap["name"], snap["file_count"]) == ("turn 1", 2)
    assert snap["state"] == ("last_write_back" if mode.name == "s3" else "live")
    before = files(api, user, "c1")

    run(api, user, "c1", "x = 42\nopen('outputs/o.txt', 'w').write('v2')\n"
                         "open('outputs/new.txt', 'w').write('n')")  # fmt: skip
    upload(api, user, "c1", "extra.csv", b"later")
    upload(api, user, "c1", "in.csv", b"replaced")

    sid = snap["snapshot_id"]
    r = api.post(url(user, "c1", "snapshots", sid, "restore"))
    assert r.status_code == 200, r.text
    assert r.json()["kernel_restarted"] is True and "interpreter" in r.json()["note"]
    assert files(api, user, "c1") == before  # exactly: later files gone, changes undone
    assert run(api, user, "c1", "print('x' in globals())").strip() == "False"
    listing = api.get(f"/api/v1/sessions/sb-session-{user}/files", params={"conversation_id": "c1"})
    assert listing.json()["files"] == ["in.csv"], listing.text
    if mode.name == "s3":  # the store holds exactly the snapshot's files: no stale object
        prefix = f"workspaces/default/sb-session-{user}/c1/"
        live = {k[len(prefix) :] for k in mode.objects(f"sb-session-{user}", "c1")
                if "/.sbw/" not in k}  # fmt: skip
        assert live == set(before), live

    assert [s["snapshot_id"] for s in api.get(url(user, "c1", "snapshots")).json()["snapshots"]] \
        == [sid]  # fmt: skip
    assert api.get(url(user, "c1", "snapshots", sid)).json()["bytes"] == snap["bytes"]
    assert api.delete(url(user, "c1", "snapshots", sid)).status_code == 204
    assert api.get(url(user, "c1", "snapshots", sid)).status_code == 404
    assert api.post(url(user, "c1", "snapshots", sid, "restore")).status_code == 404


def test_only_the_owner_reaches_snapshots_and_forks(who, mode):
    user, api = who
    run(api, user, "c1", "open('outputs/o.txt', 'w').write('mine')")
    sid = api.post(url(user, "c1", "snapshots")).json()["snapshot_id"]
    stranger = {"X-User-Id": f"u-{uuid.uuid4().hex[:10]}"}
    other_tenant = {"X-User-Id": user, "X-Tenant-Id": "elsewhere"}
    for headers in (stranger, other_tenant):
        with httpx.Client(base_url=mode.url, headers=headers, timeout=60) as other:
            answers = [
                other.post(url(user, "c1", "snapshots")),
                other.get(url(user, "c1", "snapshots")),
                other.get(url(user, "c1", "snapshots", sid)),
                other.delete(url(user, "c1", "snapshots", sid)),
                other.post(url(user, "c1", "snapshots", sid, "restore")),
                other.post(url(user, "c1", "fork"), json={"conversation_id": "theirs"}),
            ]
            assert [a.status_code for a in answers] == [404] * 6, [a.text for a in answers]
            if "X-Tenant-Id" in headers:
                other.delete(f"/api/v1/sessions/sb-session-{user}")
    assert api.get(url(user, "c1", "snapshots", sid)).status_code == 200
    assert files(api, user, "c1") == {"outputs/o.txt": "mine"}


# Before the fork: two names of one inode in the origin.
LINKED = """
import os
open('outputs/data.txt', 'w').write('origin-data')
os.link('outputs/data.txt', 'outputs/link.txt')
"""
# In the fork: writes in place, through the hard link, and after a rename.
WRITES = """
import os
with open('outputs/link.txt', 'r+') as f:
    f.write('FORK')
os.rename('outputs/data.txt', 'outputs/moved.txt')
with open('outputs/moved.txt', 'a') as f:
    f.write('+more')
with open('uploads/temparea/in.csv', 'r+') as f:
    f.write('ZZ')
"""


def test_a_fork_has_its_own_files_and_later_writes_never_cross(who, mode):
    user, api = who
    upload(api, user, "c1", "in.csv", b"a,b\n1,2\n")
    run(api, user, "c1", LINKED)
    origin = files(api, user, "c1")
    r = api.post(url(user, "c1", "fork"), json={"conversation_id": "f1"})
    assert r.status_code == 201, r.text
    assert (r.json()["conversation_id"], r.json()["forked_from"]) == ("f1", "c1")
    assert files(api, user, "f1") == origin

    # Never a shared inode: every file of the fork is one name of its own inode.
    origin_inodes = {ino for ino, _ in inodes(api, user, "c1").values()}
    fork_inodes = inodes(api, user, "f1")
    assert not origin_inodes & {ino for ino, _ in fork_inodes.values()}
    assert {nlink for _, nlink in fork_inodes.values()} == {1}

    run(api, user, "f1", WRITES)
    assert files(api, user, "c1") == origin  # nothing of the fork's writes shows
    run(api, user, "c1", "open('outputs/data.txt', 'a').write('+origin')")
    fork = files(api, user, "f1")
    assert fork["outputs/link.txt"].startswith("FORK") and "outputs/data.txt" not in fork
    assert fork["outputs/moved.txt"] == "origin-data+more"
    assert fork["uploads/temparea/in.csv"].startswith("ZZ")
    # The fork's uploads are uploads (listed), its own.
    listing = api.get(f"/api/v1/sessions/sb-session-{user}/files", params={"conversation_id": "f1"})
    assert listing.json()["files"] == ["in.csv"], listing.text

    # The same fork again: s3 answers it as made (idempotent; nothing copied over the
    # fork's own writes), local refuses it; either way the fork keeps its files.
    again = api.post(url(user, "c1", "fork"), json={"conversation_id": "f1"})
    assert again.status_code == (201 if mode.name == "s3" else 409), again.text
    assert files(api, user, "f1") == fork


def test_a_fork_from_a_snapshot_has_the_snapshots_files(who, mode):
    user, api = who
    run(api, user, "c1", "open('outputs/o.txt', 'w').write('then')")
    sid = api.post(url(user, "c1", "snapshots")).json()["snapshot_id"]
    run(api, user, "c1", "open('outputs/o.txt', 'w').write('now')")
    r = api.post(url(user, "c1", "fork"), json={"snapshot_id": sid})
    assert r.status_code == 201, r.text
    fork = r.json()["conversation_id"]
    assert files(api, user, fork) == {"outputs/o.txt": "then"}
    assert files(api, user, "c1") == {"outputs/o.txt": "now"}
    missing = api.post(url(user, "c1", "fork"), json={"snapshot_id": "0" * 32})
    assert missing.status_code == 404, missing.text


def leftovers(api, mode: Mode, user: str, cid: str, root: Path) -> list[str]:
    """What is left of a conversation and its snapshots: objects (s3) or directories."""
    if mode.name == "s3":
        return mode.objects(f"sb-session-{user}", cid)
    places = [root / cid, root / ".runtime" / "snapshots" / cid]
    return [str(p) for p in places if p.exists()]


def test_deleting_a_conversation_deletes_its_snapshots_and_never_its_forks(who, mode):
    user, api = who
    run(api, user, "c1", "open('outputs/o.txt', 'w').write('origin')")
    root = Path(run(api, user, "c1", "import os; print(os.getcwd())").strip()).parent
    api.post(url(user, "c1", "snapshots"))
    assert api.post(url(user, "c1", "fork"), json={"conversation_id": "f1"}).status_code == 201
    assert api.post(url(user, "c1", "fork"), json={"conversation_id": "f2"}).status_code == 201
    assert leftovers(api, mode, user, "c1", root)

    assert api.delete(url(user, "f1")).status_code == 200  # a fork: the origin keeps all
    assert files(api, user, "c1") == {"outputs/o.txt": "origin"}
    assert len(api.get(url(user, "c1", "snapshots")).json()["snapshots"]) == 1

    assert api.delete(url(user, "c1")).status_code == 200  # the origin: snapshots go too
    assert leftovers(api, mode, user, "c1", root) == []
    assert leftovers(api, mode, user, "f1", root) == []
    assert files(api, user, "f2") == {"outputs/o.txt": "origin"}  # the other fork stays


def _cut_off(mode: Mode, user: str, cid: str, origin: str) -> None:
    """What an API killed mid-fork leaves (s3): the copies and an unfinished mark, no
    records (the metadata is written after the copies)."""
    import asyncio

    from sandbox_workspace.store import S3Store
    from sandbox_workspace.store.snapshots import ForkMark

    base = f"workspaces/default/sb-session-{user}/{cid}/.sbw/"
    records = [k for k in mode.objects(f"sb-session-{user}", cid)
               if k.startswith((base + "files.json", base + "shards/"))]  # fmt: skip

    async def cut() -> None:
        store = S3Store(mode.seaweedfs.settings(mode.bucket))
        try:
            await store.put(base + "fork.json", ForkMark(origin, None, done=False).to_bytes())
            for key in records:
                await store.delete(key)
        finally:
            await store.aclose()

    assert records
    asyncio.run(cut())


def test_the_same_fork_again_completes_one_a_crash_cut_off(who, mode):
    """s3: a fork asked again (same origin, same target) after its answer was lost is
    idempotent, and completes a fork the API's death cut off (copies, no records) — or
    deletes it when its origin is gone. local: the runtime copies in one step; the
    same fork again is a conflict."""
    user, api = who
    upload(api, user, "c1", "in.csv", b"a,b\n")
    assert api.post(url(user, "c1", "fork"), json={"conversation_id": "f1"}).status_code == 201
    again = api.post(url(user, "c1", "fork"), json={"conversation_id": "f1"})
    if mode.name == "local":
        assert again.status_code == 409, again.text
        return
    assert again.status_code == 201 and again.json()["file_count"] == 1, again.text
    upload(api, user, "c2", "other.csv", b"c\n")
    other = api.post(url(user, "c2", "fork"), json={"conversation_id": "f1"})
    assert other.status_code == 409, other.text  # another origin: never mixed in

    _cut_off(mode, user, "f1", "c1")
    assert files(api, user, "f1") == {}  # no records: the fork's files are not there
    done = api.post(url(user, "c1", "fork"), json={"conversation_id": "f1"})
    assert done.status_code == 201 and done.json()["file_count"] == 1, done.text
    assert files(api, user, "f1") == {"uploads/temparea/in.csv": "a,b\n"}

    for cid in ("c2", "f1"):  # under the cap (3 conversations) again
        assert api.delete(url(user, cid)).status_code == 200
    assert api.post(url(user, "c1", "fork"), json={"conversation_id": "f2"}).status_code == 201
    _cut_off(mode, user, "f2", "c1")
    assert api.delete(url(user, "c1")).status_code == 200
    gone = api.post(url(user, "c1", "fork"), json={"conversation_id": "f2"})
    assert gone.status_code == 404, gone.text  # its origin gone: never completed
    assert mode.objects(f"sb-session-{user}", "f2") == []
    assert api.get(url(user, "f2", "snapshots")).status_code == 404


def test_a_fork_the_api_died_in_before_its_mark_completes_when_asked_again(start_server, seaweedfs):
    """s3, the kill window itself: the API SIGKILLed once the fork's conversation exists
    (its directory made, its origin recorded) and its store mark's write is held at the
    store (a proxy in front of it; the write is dropped, as a dead process's). After a
    restart the same fork asked again completes; a different fork (another origin,
    another snapshot) is 409; so is an empty conversation made by an execution, whose code
    forged a mark. Two servers (the first killed) and two runtimes: ~10 s, most of it
    their starts and stops."""
    bucket = f"t-{uuid.uuid4().hex[:12]}"
    seaweedfs.make_bucket(bucket)
    proxy = HoldProxy(seaweedfs.endpoint)
    env = {**seaweedfs.env(bucket), "SANDBOX_WORKSPACE_S3__ENDPOINT_URL": proxy.url}
    first = start_server("dev", "--data-dir", "data", **CAPS, **env)
    user = f"u-{uuid.uuid4().hex[:10]}"
    headers = {"X-User-Id": user}
    answers: list[object] = []

    def fork() -> None:
        try:
            with httpx.Client(base_url=first.url, headers=headers, timeout=60) as c:
                answers.append(c.post(url(user, "c1", "fork"), json={"conversation_id": "f1"}))
        except httpx.HTTPError as e:
            answers.append(e)

    with httpx.Client(base_url=first.url, headers=headers, timeout=120) as api:
        upload(api, user, "c1", "in.csv", b"a,b\n")
        proxy.hold("/f1/.sbw/fork.json")
        forker = threading.Thread(target=fork, daemon=True)
        forker.start()
        wait_for(lambda: proxy.held, "the fork's mark write held at the store", timeout=60)
    first.stop(signal.SIGKILL)
    proxy.drop()
    forker.join(60)
    assert answers and isinstance(answers[0], httpx.HTTPError), answers
    assert [k for k in mode_keys(seaweedfs, bucket, user, "f1") if k.endswith("fork.json")] == []

    direct = {**first.env, "SANDBOX_WORKSPACE_S3__ENDPOINT_URL": seaweedfs.endpoint}
    second = replace(first, env=direct, proc=None).start()
    try:
        with httpx.Client(base_url=second.url, headers=headers, timeout=120) as api:
            upload(api, user, "c2", "other.csv", b"c\n")
            other = api.post(url(user, "c2", "fork"), json={"conversation_id": "f1"})
            assert other.status_code == 409, other.text  # another origin
            snap = {"conversation_id": "f1", "snapshot_id": uuid.uuid4().hex}
            other = api.post(url(user, "c1", "fork"), json=snap)
            assert other.status_code == 409, other.text  # another source: a snapshot
            done = api.post(url(user, "c1", "fork"), json={"conversation_id": "f1"})
            assert done.status_code == 201 and done.json()["file_count"] == 1, done.text
            assert files(api, user, "f1") == {"uploads/temparea/in.csv": "a,b\n"}
            again = api.post(url(user, "c1", "fork"), json={"conversation_id": "f1"})
            assert again.status_code == 201 and again.json()["file_count"] == 1, again.text

            for cid in ("c2", "f1"):  # under the cap (3 conversations) again
                assert api.delete(url(user, cid)).status_code == 200
            assert mode_keys(seaweedfs, bucket, user, "f1") == []
            # An empty conversation (no records) whose code forged a fork's mark where it
            # can write — its own directory on the runtime's volume: never read.
            run(api, user, "e1", FORGE)
            taken = api.post(url(user, "c1", "fork"), json={"conversation_id": "e1"})
            assert taken.status_code == 409, taken.text
            assert taken.json()["error"]["code"] == "conversation_exists"
            api.delete(f"/api/v1/sessions/sb-session-{user}")
    finally:
        second.stop()
        proxy.close()


FORGE = """
import json, os
os.makedirs('.sbw', exist_ok=True)
mark = {"forked_from": "c1", "snapshot_id": None, "done": False}
open('.sbw/fork.json', 'w').write(json.dumps(mark))
origin = {"conversation_id": "c1", "snapshot_id": None}
open('.sbw/fork-origin.json', 'w').write(json.dumps(origin))
"""


def mode_keys(seaweedfs, bucket: str, user: str, cid: str) -> list[str]:
    prefix = f"workspaces/default/sb-session-{user}/{cid}/"
    return [i.key for i in seaweedfs.list_keys(bucket, prefix)]


def test_limits_refuse_with_nothing_half_made(who, mode):
    user, api = who
    upload(api, user, "c1", "big.csv", b"x" * 200_000)
    assert api.post(url(user, "c1", "snapshots")).status_code == 201
    over = api.post(url(user, "c1", "snapshots"))  # 400 kB > 300 kB
    assert over.status_code == 413, over.text
    assert "SNAPSHOT_BYTES_PER_USER" in over.json()["error"]["message"]
    assert len(api.get(url(user, "c1", "snapshots")).json()["snapshots"]) == 1
    if mode.name == "s3":
        copies = [k for k in mode.objects(f"sb-session-{user}", "c1") if "/.sbw/snapshots/" in k]
        assert len(copies) == 2, copies  # one snapshot: its file and its document

    for fork in ("f1", "f2"):  # 3 conversations: the cap
        assert api.post(url(user, "c1", "fork"), json={"conversation_id": fork}).status_code == 201
    capped = api.post(url(user, "c1", "fork"), json={"conversation_id": "f3"})
    assert capped.status_code == 429, capped.text
    assert "CONVERSATIONS_PER_USER" in capped.json()["error"]["message"]
    assert api.get(url(user, "f3", "snapshots")).status_code == 404  # no such conversation
    if mode.name == "s3":
        assert mode.objects(f"sb-session-{user}", "f3") == []


def test_two_snapshots_at_once_cannot_both_pass_the_quota(who, mode):
    """Two conversations of 200 kB each snapshotted at the same moment against a 300 kB
    quota: one is made, the other answers 413 — the check and the copies are one step
    per user (both passed when each read the bytes held before either was made)."""
    user, api = who
    for cid in ("q1", "q2"):
        upload(api, user, cid, "big.csv", b"x" * 200_000)
    start = threading.Barrier(2)
    answers: list[int] = []

    def snapshot(cid: str) -> None:
        start.wait()
        answers.append(api.post(url(user, cid, "snapshots")).status_code)

    threads = [threading.Thread(target=snapshot, args=(cid,)) for cid in ("q1", "q2")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(answers) == [201, 413], answers
    made = [len(api.get(url(user, c, "snapshots")).json()["snapshots"]) for c in ("q1", "q2")]
    assert sorted(made) == [0, 1], made


WAITING = """
import os, time
open('outputs/mid.txt', 'w').write('mid')
deadline = time.monotonic() + 60
while not os.path.exists('go') and time.monotonic() < deadline:
    time.sleep(0.01)
"""


def test_a_snapshot_during_an_execution_says_which_files_it_holds(who, mode):
    """s3: the files as last written back (what the running code wrote is not in it
    until its write-back); local: the workspace's files at that instant."""
    user, api = who
    cwd = Path(run(api, user, "c1", "import os; print(os.getcwd())").strip())
    done: list[dict] = []
    with httpx.Client(base_url=mode.url, headers={"X-User-Id": user}, timeout=120) as other:
        running = threading.Thread(
            target=lambda: done.append(
                execute(other, f"/api/v1/sessions/sb-session-{user}", WAITING, cid="c1")
            )
        )
        running.start()
        try:
            wait_for(lambda: (cwd / "outputs" / "mid.txt").exists(), "mid.txt written", 30)
            r = api.post(url(user, "c1", "snapshots"))
        finally:
            (cwd / "go").touch()
            running.join(120)
    assert r.status_code == 201 and done, r.text
    during = r.json()
    if mode.name == "s3":
        assert (during["state"], during["file_count"]) == ("last_write_back", 0)
        after = api.post(url(user, "c1", "snapshots")).json()  # after its write-back
        assert after["file_count"] == 1
    else:
        assert (during["state"], during["file_count"]) == ("live", 1)


# The object accounting is the store's (local forks are covered above): s3 mode only.
@pytest.mark.parametrize("mode", ["s3"], indirect=True)
def test_forks_snapshots_and_deletes_racing_leak_nothing_and_lose_nothing(who, mode):
    """Origins deleted while forks and snapshots of them are being made, then the forks
    deleted: a conversation whose DELETE answered has nothing left, and a live fork has
    every object its records name, byte-identical files."""
    user, api = who
    sid = f"sb-session-{user}"

    def call(answers: dict, name: str, method: str, path: str, after: float = 0, **kw) -> None:
        with httpx.Client(base_url=mode.url, headers={"X-User-Id": user}, timeout=120) as c:
            time.sleep(after)  # staggers the interleavings; no outcome depends on it
            answers[name] = c.request(method, path, **kw)

    N = 150
    for r in range(4):
        origin, forks = f"o{r}", (f"a{r}", f"b{r}")
        write = f"for i in range({N}): open(f'outputs/f{{i}}.txt', 'w').write(str(i))"
        run(api, user, origin, write)
        answers: dict[str, httpx.Response] = {}
        calls = [(f, "POST", url(user, origin, "fork"), {"json": {"conversation_id": f}})
                 for f in forks]  # fmt: skip
        calls += [("snap", "POST", url(user, origin, "snapshots"), {}),
                  ("delete", "DELETE", url(user, origin), {"after": 0.1 * r})]  # fmt: skip
        threads = [threading.Thread(target=call, args=(answers, n, m, p), kwargs=kw)
                   for n, m, p, kw in calls]  # fmt: skip
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert answers["delete"].status_code == 200, answers["delete"].text
        assert mode.objects(sid, origin) == [], f"{origin}: objects left"
        for fork in forks:
            a = answers[fork]
            assert a.status_code in (201, 404, 409), a.text  # never a 5xx, never half-made
            if a.status_code != 201:
                assert mode.objects(sid, fork) == [], f"{fork}: a failed fork left objects"
                continue
            keys = set(mode.objects(sid, fork))
            active = [f for f in manifest_of(mode, sid, fork).files if f.active]
            assert len(active) == a.json()["file_count"] == N
            lost = [f.file_path for f in active
                    if f"workspaces/default/{sid}/{fork}/{f.file_path}" not in keys]  # fmt: skip
            assert lost == [], f"{fork}: records without their object"
            assert files(api, user, fork) == {f"outputs/f{i}.txt": str(i) for i in range(N)}
        for fork in forks:
            assert api.delete(url(user, fork)).status_code == 200
            assert mode.objects(sid, fork) == [], f"{fork}: objects left"


def manifest_of(mode: Mode, sid: str, cid: str):
    import asyncio

    from sandbox_workspace.store import S3Store
    from sandbox_workspace.store.layout import Layout, Scope
    from sandbox_workspace.store.metadata import Metadata

    async def read():
        store = S3Store(mode.seaweedfs.settings(mode.bucket))
        try:
            return await Metadata(store, Layout()).get(Scope("default", sid), cid)
        finally:
            await store.aclose()

    return asyncio.run(read())
