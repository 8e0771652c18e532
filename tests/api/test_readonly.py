"""Read-only entries of a conversation that hold (runtime/readonly.py): a ``bash`` call
with ``read_only: ["data.json"]`` cannot change that file by any route — write, truncate,
rename over it, rename it away, unlink, hard link, symlink over it, mmap, a child process
— while the rest of the conversation stays writable. Against a real runtime (Landlock)."""

from __future__ import annotations

import json

import pytest

from sandbox_workspace.runtime import landlock

pytestmark = pytest.mark.skipif(not landlock.abi_version(), reason="no Landlock here")
DATA = '{"users": [1, 2]}'


def bash(runtime, code: str, cid: str = "c", **extra) -> dict:
    r = runtime.client.post(
        f"/v1/conversations/{cid}/execute",
        json={"language": "bash", "code": code, "timeout": 30, **extra},
    )
    assert r.status_code == 200, r.text
    return r.json()


def py(source: str) -> str:
    """A Python program printing the errno its one attempt fails with (or "done")."""
    body = "\n".join("    " + line for line in source.strip().splitlines())
    return (
        "python3 - <<'EOF'\nimport os, mmap, subprocess\ntry:\n"
        f"{body}\n    print('done')\nexcept OSError as e:\n    print('errno', e.errno)\nEOF"
    )


ATTACKS = {
    "append": py("open('data.json', 'a').write('x')"),
    "open-rdwr": py("os.open('data.json', os.O_RDWR)"),
    "open-trunc": py("os.open('data.json', os.O_WRONLY | os.O_TRUNC)"),
    "truncate": py("os.truncate('data.json', 0)"),
    "unlink": py("os.unlink('data.json')"),
    "rename-over": py(
        "open('outputs/new.json', 'w').write('{}')\nos.rename('outputs/new.json', 'data.json')"
    ),
    "rename-away": py("os.rename('data.json', 'outputs/moved.json')"),
    "replace-in-place": py("os.replace('data.json', 'data.json.bak')"),
    "hard-link-out": py("os.link('data.json', 'outputs/link.json')"),
    "hard-link-in-place": py("os.link('data.json', 'alias.json')"),
    "symlink-over": py(
        "os.symlink('/tmp', 'data.json.tmp')\nos.rename('data.json.tmp', 'data.json')"
    ),
    "mmap-write": py(
        "fd = os.open('data.json', os.O_RDONLY)\n"
        "mmap.mmap(fd, 0, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)[0:1] = b'X'"
    ),
    "child-process": py(
        "r = subprocess.run(['sh', '-c', 'echo x >> data.json'], capture_output=True)\n"
        "assert r.returncode != 0, 'child wrote'\nraise PermissionError(13, r.stderr.decode())"
    ),
    "chmod-then-write": py("os.chmod('data.json', 0o666)\nopen('data.json', 'w').write('x')"),
}
# Landlock answers a link or rename into another directory that would gain rights with
# EXDEV ("refer"): the call fails all the same, and ``mv`` falls back to copy + unlink,
# whose unlink is EACCES.
REFUSED = {13, 1, 18}


@pytest.fixture
def conversation(runtime):
    out = bash(runtime, f"echo '{DATA}' > data.json && echo '[1]' > data_2.json && mkdir -p sub")
    assert out["exit_code"] == 0, out
    return runtime


@pytest.mark.parametrize("attack", ATTACKS)
def test_every_way_of_changing_a_read_only_file_fails(conversation, attack):
    runtime = conversation
    out = bash(runtime, ATTACKS[attack], read_only=["data.json"])
    words = out["stdout"].split()
    assert words[:1] == ["errno"] and int(words[1]) in REFUSED, out
    after = bash(runtime, "cat data.json; ls -a")
    assert after["stdout"].split("\n")[0] == DATA
    assert "alias.json" not in after["stdout"]


def test_the_rest_stays_writable(conversation):
    out = bash(
        conversation,
        "cat data.json && echo 5 > outputs/o.txt && echo '[2]' > data_2.json "
        '&& mkdir sub/deeper && echo ok > sub/deeper/f && python3 -c "print(1)"',
        read_only=["data.json"],
    )
    assert out["exit_code"] == 0, out
    assert out["stdout"].split("\n")[:2] == [DATA, "1"]
    check = bash(conversation, "cat outputs/o.txt data_2.json sub/deeper/f")
    assert check["stdout"].split() == ["5", "[2]", "ok"]
    # The top level itself is read-only during such a call (Landlock cannot do finer).
    top = bash(conversation, "echo x > new.txt", read_only=["data.json"])
    assert top["exit_code"] != 0 and "Permission denied" in top["stderr"]
    # And the same file is writable again in an ordinary call.
    assert bash(conversation, "echo '{}' > data.json")["exit_code"] == 0


def test_a_symlink_made_earlier_grants_nothing(conversation):
    bash(conversation, "echo secret > f", cid="other")
    other = bash(conversation, "pwd", cid="other")["stdout"].strip()
    assert bash(conversation, f"ln -s {other} link")["exit_code"] == 0
    out = bash(conversation, "echo x > link/f", read_only=["data.json"])
    assert out["exit_code"] != 0
    assert bash(conversation, "cat f", cid="other")["stdout"] == "secret\n"


@pytest.mark.parametrize(
    ("extra", "code"),
    [
        ({"language": "python", "read_only": ["data.json"]}, "invalid_read_only"),
        ({"read_only": ["../x"]}, "invalid_read_only"),
        ({"read_only": ["a/b"]}, "invalid_read_only"),
    ],
)
def test_bad_read_only_requests(runtime, extra, code):
    body = {"language": "bash", "code": "true", **extra}
    r = runtime.client.post("/v1/conversations/c/execute", json=body)
    assert (r.status_code, r.json()["error"]["code"]) == (400, code), r.text


@pytest.mark.parametrize("runtime_env", [{"SANDBOX_RUNTIME_CONFINEMENT": "none"}])
def test_without_landlock_read_only_is_refused_not_pretended(runtime):
    r = runtime.client.post(
        "/v1/conversations/c/execute",
        json={"language": "bash", "code": "true", "read_only": ["data.json"]},
    )
    assert r.status_code == 503 and r.json()["error"]["code"] == "confinement_unavailable"
    assert json.loads(r.text)["error"]["message"].startswith("read_only needs Landlock")
