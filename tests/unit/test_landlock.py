"""Our Landlock binding: the ABI downgrade table, and the rules really enforced by the kernel.

Enforcement is checked in a child interpreter (Landlock is irreversible for a process):
it restricts itself, then tries what it may and may not do and reports each errno.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from sandbox_workspace.runtime import landlock
from sandbox_workspace.runtime.confinement import Confinement

NO_LANDLOCK = Path(__file__).parents[1] / "support" / "no_landlock.py"
FS_V1 = (1 << 13) - 1
NET = landlock.NET_BIND_TCP | landlock.NET_CONNECT_TCP
SCOPES = landlock.SCOPE_ABSTRACT_UNIX_SOCKET | landlock.SCOPE_SIGNAL
FULL = landlock.Policy(landlock.fs_all(5), NET, SCOPES)


@pytest.mark.parametrize(
    ("abi", "expected"),
    [
        pytest.param(0, landlock.Policy(0), id="none"),
        pytest.param(1, landlock.Policy(FS_V1), id="abi1-fs-only"),
        pytest.param(2, landlock.Policy(FS_V1 | landlock.FS_REFER), id="abi2-refer"),
        pytest.param(
            3, landlock.Policy(FS_V1 | landlock.FS_REFER | landlock.FS_TRUNCATE), id="abi3"
        ),
        pytest.param(
            4, landlock.Policy(FS_V1 | landlock.FS_REFER | landlock.FS_TRUNCATE, NET), id="abi4-tcp"
        ),
        pytest.param(5, landlock.Policy(landlock.fs_all(5), NET), id="abi5-ioctl"),
        pytest.param(6, FULL, id="abi6-scopes"),
        pytest.param(7, FULL, id="abi7"),
    ],
)
def test_policy_downgrades_to_what_the_abi_knows(abi, expected):
    assert FULL.for_abi(abi) == expected


def test_missing_landlock_is_reported_with_its_cause():
    probe = "from sandbox_workspace.runtime import landlock as l; print(l.abi_version()); " + (
        "print(l.unavailable_reason())"
    )
    out = subprocess.run(
        [sys.executable, str(NO_LANDLOCK), sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    assert out[0] == "0"
    assert "seccomp" in out[1] and "Function not implemented" in out[1]


def test_read_only_rules_never_reach_a_protected_directory(tmp_path):
    confinement = Confinement(max_processes=64, mode="none")
    prefix = os.path.realpath(sys.prefix)
    rules = dict(confinement.read_only_rules(protected=[os.path.join(prefix, "data")]))
    assert prefix not in rules, "a parent of the workspace would expose it"
    assert "/usr" in rules and rules["/dev/null"] & landlock.FS_WRITE_FILE


CHILD = r"""
import errno, json, os, signal, socket, sys
from sandbox_workspace.runtime import landlock as l
ro, rw, outside, port = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
policy = l.Policy(l.fs_all(5), l.NET_BIND_TCP | l.NET_CONNECT_TCP,
                  l.SCOPE_ABSTRACT_UNIX_SOCKET | l.SCOPE_SIGNAL).for_abi(l.abi_version())
rules = [(ro, l.FS_READ), (rw, l.fs_all(l.abi_version())), ("/no/such", l.FS_READ)]
fd = l.build_ruleset(policy, rules)
l.restrict_self(fd)
results = {}
def check(name, fn):
    try:
        fn()
        results[name] = "ok"
    except OSError as e:
        results[name] = errno.errorcode[e.errno]
def write(path):
    with open(path, "w") as f:
        f.write("x")
check("read ro", lambda: open(os.path.join(ro, "f")).read())
check("write ro", lambda: write(os.path.join(ro, "new")))
check("write rw", lambda: write(os.path.join(rw, "new")))
check("truncate rw", lambda: os.truncate(os.path.join(rw, "new"), 0))
check("read outside", lambda: open(os.path.join(outside, "f")).read())
check("link outside into rw", lambda: os.link(os.path.join(outside, "f"), os.path.join(rw, "l")))
check("rename rw into ro", lambda: os.rename(os.path.join(rw, "new"), os.path.join(ro, "moved")))
check("connect", lambda: socket.create_connection(("127.0.0.1", port), timeout=2))
check("bind", lambda: socket.socket().bind(("127.0.0.1", 0)))
check("signal parent", lambda: os.kill(os.getppid(), 0))
print(json.dumps(results))
"""


@pytest.mark.skipif(landlock.abi_version() < 6, reason="needs Landlock ABI >= 6 (scopes)")
def test_the_kernel_enforces_the_ruleset(tmp_path):
    ro, rw, outside = (tmp_path / n for n in ("ro", "rw", "outside"))
    for d in (ro, rw, outside):
        d.mkdir()
        (d / "f").write_text("data")
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        out = subprocess.run(
            [sys.executable, "-c", CHILD, str(ro), str(rw), str(outside), str(port)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    assert json.loads(out) == {
        "read ro": "ok",
        "write ro": "EACCES",
        "write rw": "ok",
        "truncate rw": "ok",
        "read outside": "EACCES",
        "link outside into rw": "EXDEV",
        "rename rw into ro": "EACCES",
        "connect": "EACCES",
        "bind": "EACCES",
        "signal parent": "EPERM",
    }


@pytest.mark.parametrize(
    ("abi", "min_abi", "refused"),
    [
        pytest.param(0, 6, "Landlock is unavailable", id="none"),
        pytest.param(1, 6, "ABI 3: truncate", id="abi1-no-truncate"),
        pytest.param(2, 3, "ABI 3: truncate", id="abi2-below-3"),
        pytest.param(5, 6, "ABI 6: signals", id="abi5-no-signal-scope"),
        pytest.param(3, 3, None, id="abi3-accepted-at-3"),
        pytest.param(6, 6, None, id="abi6"),
        pytest.param(7, 6, None, id="abi7"),
    ],
)
def test_require_refuses_an_abi_below_its_minimum(abi, min_abi, refused) -> None:
    """``require`` with ``min_abi``: a kernel below it refuses code (503), naming what it
    lacks; ``auto`` runs code on any ABI (saying what is missing)."""
    from sandbox_workspace.runtime.confinement import ConfinementUnavailable

    strict = Confinement(max_processes=64, mode="require", min_abi=min_abi, abi=abi)
    if refused is None:
        strict.check_can_execute()
    else:
        with pytest.raises(ConfinementUnavailable, match=refused):
            strict.check_can_execute()
    Confinement(max_processes=64, mode="auto", min_abi=min_abi, abi=abi).check_can_execute()
