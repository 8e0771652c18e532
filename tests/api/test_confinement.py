"""Executed code is confined to its conversation and cannot outlive it.

Through the API: the hostile catalogue (tests/support/hostile_code.py) is refused and the
sandbox stays healthy — on the plain local backend, under bubblewrap, and (the same
catalogue) with confinement off, where it must find the leaks, so the catalogue itself is
known to bite. Through a runtime: the stats report, the missing-Landlock paths under a
real seccomp filter, a non-root uid without capabilities, and process tracking that
``setsid``/double fork/``nohup`` cannot escape.
"""

from __future__ import annotations

import os
import shutil
import socket
import sys
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from hostile_code import ATTACKS, play, run_hostile_suite
from polling import wait_for

from sandbox_workspace.runtime import landlock
from sandbox_workspace.runtime.settings import RuntimeSettings

ABI = landlock.abi_version()
needs_landlock = pytest.mark.skipif(not ABI, reason="this kernel offers no Landlock")
NO_LANDLOCK = [sys.executable, str(Path(__file__).parents[1] / "support" / "no_landlock.py")]


@needs_landlock
def test_hostile_code_is_refused_and_the_sandbox_stays_healthy(api, session_url):
    run_hostile_suite(api, session_url)


@pytest.mark.local_backend
def test_the_catalogue_finds_the_leaks_when_code_is_not_confined(start_server):
    server = start_server(
        "dev", "--data-dir", "data",
        SANDBOX_WORKSPACE_SANDBOX_MOUNT="none", SANDBOX_WORKSPACE_CONFINEMENT="none",
    )  # fmt: skip
    # Not played unconfined: signals would kill this server, grep would walk the machine,
    # and an unconfined process has no stray descriptors either way.
    skipped = ("signals", "grep", "inherited")
    attacks = [a for a in ATTACKS if not a.name.startswith(skipped)]
    with httpx.Client(base_url=server.url, headers={"X-User-Id": "leaky"}, timeout=60) as api:
        _, failures = play(api, "/api/v1/sessions/sb-session-leaky", attacks)
    assert sorted(failures) == sorted(a.name for a in attacks)


@needs_landlock
@pytest.mark.local_backend
def test_network_allowed_lets_code_connect(start_server):
    server = start_server(
        "dev", "--data-dir", "data",
        SANDBOX_WORKSPACE_SANDBOX_MOUNT="none", SANDBOX_WORKSPACE_SESSION_NETWORK="allow",
    )  # fmt: skip
    network = [a for a in ATTACKS if a.when_allowed]
    assert {a.when_allowed for a in network} == {"connect", "udp send"}
    # With the network allowed code may make sockets again (no seccomp filter): another
    # conversation's abstract socket is then refused by Landlock's scope alone.
    abstract = [a for a in ATTACKS if a.name.startswith("abstract unix socket")]
    with httpx.Client(base_url=server.url, headers={"X-User-Id": "net"}, timeout=60) as api:
        _, failures = play(
            api, "/api/v1/sessions/sb-session-net", network + abstract, network="allow"
        )
    assert not failures


@needs_landlock
@pytest.mark.bwrap
@pytest.mark.local_backend
@pytest.mark.skipif(not shutil.which("bwrap"), reason="bubblewrap is not installed")
def test_hostile_code_is_refused_under_bubblewrap(start_server):
    server = start_server("dev", "--data-dir", "data", SANDBOX_WORKSPACE_SANDBOX_MOUNT="bwrap")
    with httpx.Client(base_url=server.url, headers={"X-User-Id": "bw"}, timeout=60) as api:
        run_hostile_suite(api, "/api/v1/sessions/sb-session-bw")


# -- one runtime ---------------------------------------------------------------------------


def _execute(runtime, cid: str, code: str, language: str = "python", **extra) -> httpx.Response:
    return runtime.client.post(
        f"/v1/conversations/{cid}/execute",
        json={"language": language, "code": code, "timeout": 30, **extra},
    )


def _pids_with(marker: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def _wait(condition, what: str, timeout: float = 10.0):
    return wait_for(condition, what, timeout)


@needs_landlock
def test_stats_report_full_confinement(runtime):
    report = runtime.client.get("/v1/stats").json()["confinement"]
    assert report["mode"] == "auto" and report["confined"] is True
    assert report["landlock_abi"] == ABI and report["network"] == "denied"
    expected = {"filesystem", "tcp", "subreaper", "inet_sockets", "unix_sockets"}
    if ABI >= 6:
        expected |= {"refer", "truncate", "ioctl_dev", "scope_signal"}
        expected |= {"scope_abstract_unix_socket"}
        assert report["reason"] == ""
    assert expected <= set(report["features"])


@pytest.mark.parametrize("runtime_env", [{"SANDBOX_RUNTIME_CONFINEMENT": "none"}])
def test_stats_say_when_confinement_is_off(runtime):
    report = runtime.client.get("/v1/stats").json()["confinement"]
    assert (report["mode"], report["confined"], report["network"]) == (
        "none",
        False,
        "unrestricted",
    )
    assert "confinement: none" in report["reason"]


@pytest.mark.parametrize("runtime_wrapper", [NO_LANDLOCK])
@pytest.mark.parametrize("runtime_env", [{"SANDBOX_RUNTIME_CONFINEMENT": "require"}])
def test_require_without_landlock_refuses_code_but_keeps_files(runtime):
    refused = _execute(runtime, "c", "print(1)")
    assert refused.status_code == 503, refused.text
    error = refused.json()["error"]
    assert error["code"] == "confinement_unavailable"
    assert "Landlock" in error["message"] and "seccomp" in error["message"]
    assert _execute(runtime, "c", "true", "bash").status_code == 503
    assert runtime.upload("c", "kept.csv", b"1").status_code == 201
    names = [f["name"] for f in runtime.client.get("/v1/conversations/c/uploads").json()["files"]]
    assert names == ["kept.csv"]
    report = runtime.client.get("/v1/stats").json()["confinement"]
    assert (report["confined"], report["landlock_abi"]) == (False, 0)
    assert "seccomp" in report["reason"]


@pytest.mark.parametrize("runtime_wrapper", [NO_LANDLOCK])
def test_auto_without_landlock_runs_code_and_says_so_loudly(runtime):
    out = _execute(runtime, "c", "print('ran')").json()
    assert out["stdout"] == "ran\n"
    report = runtime.client.get("/v1/stats").json()["confinement"]
    assert (report["mode"], report["confined"], report["network"]) == (
        "auto",
        False,
        "unrestricted",
    )
    assert "seccomp" in report["reason"]
    assert "EXECUTED CODE IS NOT CONFINED" in runtime.server.log()
    # Without Landlock the seccomp filter still holds: no UDP, no unix socket.
    assert {"inet_sockets", "unix_sockets"} <= set(report["features"])
    for family in ("AF_INET, socket.SOCK_DGRAM", "AF_UNIX"):
        code = f"import socket\ntry:\n    socket.socket(socket.{family})\n"
        code += "except PermissionError:\n    print('refused')"
        assert _execute(runtime, "c", code).json()["stdout"] == "refused\n", family


SOCKETS_THAT_STAY = """
import multiprocessing, os, socket
refused = []
for name in ("AF_UNIX", "AF_INET", "AF_INET6", "AF_PACKET", "AF_VSOCK", "AF_ALG"):
    try:
        socket.socket(getattr(socket, name)).close()
    except PermissionError:
        refused.append(name)
a, b = socket.socketpair()  # IPC inside the code's own processes
a.sendall(b"pair")
ours, theirs = multiprocessing.Pipe()  # a socketpair too
child = multiprocessing.get_context("fork").Process(target=lambda: theirs.send([1, 2, 3]))
child.start()
squares = ours.recv()
child.join()
netlink = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW)  # getifaddrs, getaddrinfo
netlink.close()
print(sorted(refused), b.recv(4).decode(), squares, socket.getaddrinfo("localhost", 80)[0][4][1])
"""


def test_with_the_network_denied_code_makes_no_socket_but_pairs_processes_and_netlink(runtime):
    out = _execute(runtime, "c", SOCKETS_THAT_STAY).json()
    assert out["stdout"] == (  # what failed, if anything: out["error"]
        "['AF_ALG', 'AF_INET', 'AF_INET6', 'AF_PACKET', 'AF_UNIX', 'AF_VSOCK'] pair [1, 2, 3] 80\n"
    ), out["error"]


BWRAP = shutil.which("bwrap")
# A user namespace: uid 65534 inside, no capability anywhere — as in a pod.
UNPRIVILEGED = [
    *(BWRAP or "bwrap", "--unshare-user", "--uid", "65534", "--gid", "65534"),
    *("--bind", "/", "/", "--dev-bind", "/dev", "/dev", "--die-with-parent", "--"),
]


@needs_landlock
@pytest.mark.skipif(not BWRAP, reason="bubblewrap is needed to switch to a uid without caps")
@pytest.mark.parametrize("runtime_wrapper", [UNPRIVILEGED])
def test_confinement_needs_no_privilege(runtime):
    who = _execute(
        runtime, "b", "id -u; grep CapEff /proc/self/status; echo secret > mine.txt", "bash"
    ).json()
    assert who["stdout"].split()[:3] == ["65534", "CapEff:", "0000000000000000"], who
    theft = _execute(runtime, "a", "open('../b/mine.txt').read()").json()
    assert theft["error"]["name"] == "PermissionError", theft
    report = runtime.client.get("/v1/stats").json()["confinement"]
    assert report["confined"] is True and "rlimit_nproc" in report["features"]


def test_background_processes_of_a_finished_bash_call_are_killed(runtime):
    marker = f"sbw-escape-{uuid.uuid4().hex}"
    script = (
        f"setsid sh -c 'sleep 300; : {marker}' & "
        f"(nohup sh -c 'sleep 300; : {marker}' >/dev/null 2>&1 &) ; "
        f"sh -c 'sh -c \"sleep 300; : {marker}\" & exit' ; echo started"
    )
    out = _execute(runtime, "c", script, "bash").json()
    assert out["stdout"] == "started\n", out
    _wait(lambda: not _pids_with(marker), "the escaped processes to be killed", timeout=5)


def test_deleting_a_conversation_kills_daemons_and_removes_its_scratch(runtime):
    marker = f"sbw-daemon-{uuid.uuid4().hex}"
    # A double-forked, setsid daemon started from Python keeps writing between calls.
    start = (
        "import os, subprocess\n"
        f"subprocess.Popen(['setsid', 'sh', '-c', 'while :; do date >> log.txt; sleep 0.02; "
        f"done; : {marker}'], start_new_session=True)\n"
        "os.environ['TMPDIR']"
    )
    out = _execute(runtime, "c", start).json()
    scratch = Path(out["results"][0]["data"]["text/plain"].strip("'"))
    assert scratch.is_dir() and not scratch.is_relative_to(runtime.root)
    _wait(lambda: _pids_with(marker), "the daemon to run")
    alive = _execute(runtime, "c", "sleep 0.1; wc -l < log.txt", "bash").json()
    assert int(alive["stdout"]) > 0, "the daemon outlives the call that started it"
    assert runtime.client.delete("/v1/conversations/c").status_code == 200
    assert not _pids_with(marker), "no process of a deleted conversation may survive"
    assert not scratch.exists()
    assert not (runtime.root / "c").exists()
    # The conversation made again gets a working sandbox (new directories, new ruleset).
    again = _execute(runtime, "c", "echo new > f.txt; echo $TMPDIR > t; cat f.txt", "bash").json()
    assert again["stdout"] == "new\n" and again["exit_code"] == 0, again


def test_an_execution_in_flight_ends_with_an_error_when_its_conversation_goes(runtime):
    with ThreadPoolExecutor(1) as pool:
        code = "import time\nopen('started', 'w').close()\ntime.sleep(60)"
        running = pool.submit(_execute, runtime, "c", code, timeout=60)
        _wait(lambda: (runtime.root / "c" / "started").exists(), "the call to run")
        assert runtime.client.delete("/v1/conversations/c").status_code == 200
        result = running.result(timeout=20).json()
    assert result["error"]["name"] == "ConversationStopped", result


@needs_landlock
def test_code_cannot_signal_the_runtime_or_the_spawner(runtime):
    out = _execute(
        runtime,
        "c",
        f"kill -9 {runtime.server.proc.pid} $PPID 2>&1; echo rc=$?",
        "bash",
    ).json()
    assert "Operation not permitted" in out["stdout"] and "rc=1" in out["stdout"], out
    assert runtime.client.get("/healthz").status_code == 200
    assert _execute(runtime, "c", "print('alive')").json()["stdout"] == "alive\n"
    assert os.path.exists(f"/proc/{runtime.server.proc.pid}")


def test_a_killed_spawner_takes_its_code_along_and_comes_back(runtime):
    first = _execute(runtime, "c", "import os\nos.getpid()").json()
    kernel = int(first["results"][0]["data"]["text/plain"])
    [spawner] = [
        pid
        for pid in _pids_with("spawner_main")
        if f"PPid:\t{runtime.server.proc.pid}\n" in Path(f"/proc/{pid}/status").read_text()
    ]
    os.kill(spawner, 9)
    _wait(lambda: not Path(f"/proc/{kernel}").exists(), "the interpreter to die with it")
    again = _execute(runtime, "c", "print('back')").json()
    assert again["stdout"] == "back\n" and again["kernel_restarted"] is True, again


PROXY_PORT_CODE = """
import errno, os, socket
def refused(make):
    try:
        make().close()
    except OSError as e:
        return errno.errorcode[e.errno]
    return "made"
proxy, other = int(os.environ["PROXY_PORT"]), int(os.environ["OTHER_PORT"])
print(
    refused(lambda: socket.create_connection(("127.0.0.1", proxy), timeout=5)),
    refused(lambda: socket.create_connection(("127.0.0.1", other), timeout=5)),
    refused(lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM)),
    refused(lambda: socket.socket(socket.AF_INET6, socket.SOCK_STREAM)),
    os.environ["HTTPS_PROXY"], os.environ["HOME"] != "/nowhere",
)
"""


@pytest.mark.skipif(ABI < 4, reason="Landlock TCP rules need ABI 4")
class TestProxyPort:
    """Network ``proxy_port`` (a sandbox pod with an egress policy): code reaches the
    egress proxy's TCP port and nothing else — on a CNI that enforces no NetworkPolicy
    too — and sees the variables the operator gave it (``code_env``), the runtime's own
    winning a clash."""

    @pytest.fixture
    def ports(self):
        servers = [socket.create_server(("127.0.0.1", 0)) for _ in range(2)]
        yield [s.getsockname()[1] for s in servers]
        for s in servers:
            s.close()

    @pytest.fixture
    def runtime_env(self, ports):
        proxy, other = ports
        code_env = {
            "HTTPS_PROXY": f"http://127.0.0.1:{proxy}",
            "PROXY_PORT": str(proxy),
            "OTHER_PORT": str(other),
            "HOME": "/nowhere",
        }
        return RuntimeSettings.env(network="proxy_port", egress_proxy_port=proxy, code_env=code_env)

    def test_code_reaches_the_proxy_port_alone(self, runtime, ports):
        out = _execute(runtime, "c", PROXY_PORT_CODE).json()
        assert out["stdout"] == (f"made EACCES EACCES EACCES http://127.0.0.1:{ports[0]} True\n"), (
            out["error"]
        )
        report = runtime.client.get("/v1/stats").json()["confinement"]
        assert report["network"] == "proxy"
