"""Shared fixtures: real processes on loopback, started the way a user starts them.

- ``runtime``: one ``sandbox-workspace runtime`` process on 127.0.0.1 with a known token
  and a temporary root (tests of the runtime's own contract).
- ``dev_server``: one ``sandbox-workspace dev`` process (API + local backend) for the test
  session; tests stay apart by using distinct users (``user`` fixture), each of which owns
  its own session and runtime process, deleted after the test.
- ``start_server``: factory for further servers with their own settings (auth modes).
Every process is stopped at teardown and checked to leave no runtime behind.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from prebuild import Prebuild, make_scheduler, order
from redis_server import missing_reason, start_redis
from seaweedfs import SeaweedFS, start_seaweedfs
from seaweedfs import missing_reason as seaweedfs_missing

from sandbox_workspace.runtime.scratch import remove_recorded

PYTHON = sys.executable
START_TIMEOUT = 30.0


@dataclass
class ServerProcess:
    """A ``sandbox-workspace`` subprocess listening on a loopback port."""

    argv: list[str]
    env: dict[str, str]
    workdir: Path
    proc: subprocess.Popen | None = None
    url: str = ""
    log_path: Path = field(init=False)
    _interrupted: bool = field(default=False, init=False)

    def start(self) -> ServerProcess:
        port_file = self.workdir / f"port-{uuid.uuid4().hex}"
        self.log_path = self.workdir / f"server-{uuid.uuid4().hex[:8]}.log"
        self._interrupted = False
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [*self.argv, "--port", "0", "--port-file", str(port_file)],
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.workdir,
                start_new_session=True,
            )
        deadline = time.monotonic() + START_TIMEOUT
        while not port_file.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"server did not start:\n{self.log()}")
            time.sleep(0.02)
        self.url = f"http://127.0.0.1:{int(port_file.read_text())}"
        while True:
            try:
                if httpx.get(self.url + "/healthz", timeout=1).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"server never answered /healthz:\n{self.log()}")
            time.sleep(0.02)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def interrupt(self, sig: int = signal.SIGINT) -> None:
        """Ask the server to stop, without waiting (``stop`` then waits): servers asked
        together shut down side by side. Asked once only — a second SIGINT makes uvicorn
        force its exit, skipping the graceful part the tests check."""
        assert self.proc is not None
        if self.proc.poll() is None and not self._interrupted:
            self._interrupted = True
            self.proc.send_signal(sig)

    def stop(self, sig: int = signal.SIGINT) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.interrupt(sig)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        return self.proc.returncode


def runtime_pids_under(path: Path) -> list[int]:
    """Runtime processes whose command line mentions ``path`` (orphan detection)."""
    needle = str(path).encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if b"runtime" in cmdline and needle in cmdline:
            pids.append(int(entry.name))
    return pids


def _base_env(**extra: str | None) -> dict[str, str]:
    """The tests' environment for a server; an ``extra`` value None leaves that out."""
    env = {
        k: v
        for k, v in os.environ.items()
        # OTEL_*: a developer's own collector never receives the tests' spans.
        if not k.startswith(("SANDBOX_WORKSPACE_", "SANDBOX_RUNTIME_", "OTEL_"))
    }
    # No demo model unless a test asks: a dev server without a model answers chat 503.
    env.update(
        {"SANDBOX_WORKSPACE_LOG_FORMAT": "text", "SANDBOX_WORKSPACE_DEMO_MODEL": "false", **extra}
    )
    return {k: v for k, v in env.items() if v is not None}


@pytest.fixture
def runtime_env() -> dict[str, str]:
    """Extra SANDBOX_RUNTIME_* settings for the ``runtime`` fixture (override to tune)."""
    return {}


@pytest.fixture
def runtime_wrapper() -> list[str]:
    """A command the ``runtime`` fixture runs the runtime under (a uid switch, a seccomp
    filter); override to use one."""
    return []


@pytest.fixture
def runtime(
    tmp_path: Path, runtime_env: dict[str, str], runtime_wrapper: list[str]
) -> Iterator[RuntimeHandle]:
    token = secrets.token_urlsafe(24)
    root = tmp_path / "workspace"
    root.mkdir()
    server = ServerProcess(
        [
            *runtime_wrapper,
            *(PYTHON, "-m", "sandbox_workspace", "runtime", "--host", "127.0.0.1"),
            *("--root", str(root)),
        ],
        _base_env(
            **{
                "SANDBOX_RUNTIME_TOKEN": token,
                "SANDBOX_RUNTIME_MAX_FILE_SIZE_BYTES": "1048576",
                "SANDBOX_RUNTIME_MAX_FILE_COUNT": "5",
                "SANDBOX_RUNTIME_ALLOWED_FILE_TYPES": "",
                **runtime_env,  # may override any of the above
            }
        ),
        tmp_path,
    ).start()
    with httpx.Client(
        base_url=server.url, headers={"Authorization": f"Bearer {token}"}, timeout=30
    ) as client:
        yield RuntimeHandle(server=server, token=token, root=root, client=client)
    # Asked to stop now, waited for when the module ends (``_servers_end_with_their_module``):
    # its shutdown (graceful: the spawner and its calls end first) overlaps the next test's setup
    # instead of adding to each of the ~220 tests that take a runtime of their own.
    server.interrupt(signal.SIGTERM)
    _runtimes_stopping.append((server, root))


# With their roots: what a runtime the test killed left in /tmp is removed at the end.
_runtimes_stopping: list[tuple[ServerProcess, Path]] = []


@dataclass
class RuntimeHandle:
    server: ServerProcess
    token: str
    root: Path
    client: httpx.Client

    def upload(self, cid: str, name: str, data: bytes, **form: str) -> httpx.Response:
        return self.client.post(
            "/v1/uploads", files={"file": (name, data)}, data={"conversation_id": cid, **form}
        )


@pytest.fixture(scope="session")
def start_server(tmp_path_factory: pytest.TempPathFactory):
    """``start_server(*args, session_wide_server=False, **env)``: a ``sandbox-workspace`` server.
    One started for a module (or a test) is stopped when its module ends
    (``_servers_end_with_their_module``): idle servers and their runtimes left running to
    the session's end cost CPU every second (~1 % each; hundreds by the last tiers).
    The session-scoped servers (``dev_server``, ``chat_server``, ``ui_server``) say
    ``session_wide_server=True`` and are stopped at the session's end."""
    started: list[ServerProcess] = []
    session_wide: list[ServerProcess] = []

    def start(*args: str, session_wide_server: bool = False, **env: str | None) -> ServerProcess:
        workdir = tmp_path_factory.mktemp("server")
        server = ServerProcess(
            [PYTHON, "-m", "sandbox_workspace", *args], _base_env(**env), workdir
        ).start()
        (session_wide if session_wide_server else started).append(server)
        return server

    def stop_module_servers() -> None:
        servers, started[:] = list(started), []
        _stop_all(servers)

    start.stop_module_servers = stop_module_servers  # type: ignore[attr-defined]
    yield start
    _stop_all(started + session_wide)


def _stop_all(servers: list[ServerProcess]) -> None:
    # All asked first, then waited for: each stops its runtimes and ends its server in
    # ~0.5-2 s, so a module's ten servers took 5-20 s one after another.
    for server in servers:
        server.interrupt()
    for server in servers:
        server.stop()
    # Checked after all are stopped: a server may use another's data directory.
    leftover = [pid for server in servers for pid in runtime_pids_under(server.workdir)]
    for pid in leftover:
        os.kill(pid, signal.SIGKILL)
    # The scratch roots of sessions' runtimes that were killed (by a test, or just now)
    # and whose sessions were not deleted: their records say where (runtime/scratch.py).
    for server in servers:
        for workspace in server.workdir.glob("*/sessions/*/workspace"):
            remove_recorded(workspace)
    assert not leftover, f"runtime processes outlived their API: {leftover}"


@pytest.fixture(scope="module", autouse=True)
def _servers_end_with_their_module(start_server) -> Iterator[None]:
    """Stops the servers a module started when the module ends (autouse, so torn down
    after the module's own fixtures, which may still talk to them in their teardown)."""
    yield
    start_server.stop_module_servers()
    stopping, _runtimes_stopping[:] = list(_runtimes_stopping), []
    for server, root in stopping:
        server.stop(signal.SIGTERM)  # asked already: waits (SIGKILL past 20 s)
        # A runtime killed (by its test, or past those 20 s) could not remove its scratch
        # root; the next start would have. Its record says where (runtime/scratch.py).
        remove_recorded(root)


EXTERNAL_API = os.environ.get("SANDBOX_TEST_API_URL")


REPO = Path(__file__).resolve().parents[1]
INSIDE_NODE_TIER = os.environ.get("SANDBOX_NODE_NETNS") == "1"  # no network: no builds
XDIST_WORKER = bool(os.environ.get("PYTEST_XDIST_WORKER"))
_prebuild = Prebuild(REPO)


def pytest_configure(config: pytest.Config) -> None:
    if XDIST_WORKER:
        _prebuild.adopt()  # the controller started the builds; a worker only waits


@pytest.hookimpl(tryfirst=True)  # before xdist's own, which starts the workers
def pytest_sessionstart(session: pytest.Session) -> None:
    config = session.config
    if config.pluginmanager.has_plugin("dsession") and not INSIDE_NODE_TIER:
        _prebuild.start_for_paths(list(config.args))


def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """``--dist loadgroup``: our units of work (tests/support/prebuild.py ``unit``)."""
    if config.getvalue("dist") == "loadgroup":
        return make_scheduler(config, log)
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    order(items, REPO / "tests")  # light tiers first; the heavy ones find their builds done
    if not EXTERNAL_API:
        return
    skip = pytest.mark.skip(
        reason=f"exercises the local backend; the suite runs against "
        f"the external API {EXTERNAL_API}"
    )
    for item in items:
        if "local_backend" in item.keywords:
            item.add_marker(skip)


@pytest.hookimpl(trylast=True)  # after the tiers' own hooks have marked what they skip
def pytest_collection_finish(session: pytest.Session) -> None:
    if not session.config.option.collectonly and not INSIDE_NODE_TIER and not XDIST_WORKER:
        _prebuild.start(session.items)


@pytest.hookimpl(wrapper=True, tryfirst=True)  # outermost: outside pytest-timeout's timer
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    _prebuild.wait(item)
    return (yield)


def pytest_sessionfinish(session: pytest.Session) -> None:
    _prebuild.stop()


@pytest.fixture(scope="session")
def dev_server(start_server) -> ServerProcess:
    """The API under test: a local-backend ``dev`` server, or — when SANDBOX_TEST_API_URL
    is set (the cluster tier runs this suite against the kubernetes backend) — that API."""
    if EXTERNAL_API:
        return ServerProcess(argv=[], env={}, workdir=Path("."), url=EXTERNAL_API)
    # Without bubblewrap the reported paths are host paths, so tests can check the bytes
    # on disk directly; tests/api/test_bwrap.py covers the /workspace presentation.
    return start_server(
        "dev",
        "--data-dir",
        "data",
        session_wide_server=True,
        SANDBOX_WORKSPACE_SANDBOX_MOUNT="none",
    )


@pytest.fixture
def user(dev_server: ServerProcess) -> Iterator[str]:
    """A fresh user id; its session (if any) is deleted after the test."""
    user_id = f"u-{uuid.uuid4().hex[:10]}"
    yield user_id
    httpx.delete(
        f"{dev_server.url}/api/v1/sessions/sb-session-{user_id}",
        headers={"X-User-Id": user_id},
        timeout=30,
    )


@pytest.fixture
def api(dev_server: ServerProcess, user: str) -> Iterator[httpx.Client]:
    """An HTTP client of the dev server speaking as ``user``."""
    with httpx.Client(base_url=dev_server.url, headers={"X-User-Id": user}, timeout=60) as client:
        yield client


@pytest.fixture
def session_url(user: str) -> str:
    return f"/api/v1/sessions/sb-session-{user}"


@pytest.fixture(scope="session")
def runtime_pids():
    """``runtime_pids(path)``: pids of runtime processes started under ``path``."""
    return runtime_pids_under


def wait_for_status(client: httpx.Client, url: str, wanted: str, timeout: float = 30) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        body = client.get(url).json()
        if body.get("status") == wanted:
            return body
        if time.monotonic() > deadline:
            raise AssertionError(f"status stayed {body.get('status')!r}, wanted {wanted!r}")
        time.sleep(0.05)


@pytest.fixture(scope="session")
def wait_status():
    """``wait_status(client, url, wanted)``: poll a session until it has that status."""
    return wait_for_status


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory) -> Iterator[str]:
    """A throwaway Redis-protocol server on loopback (skipped with the reason where none
    can be installed), shared by a module's tests."""
    reason = missing_reason()
    if reason:
        pytest.skip(reason)
    server = start_redis(tmp_path_factory.mktemp("redis"))
    yield server.url
    server.stop()


@pytest.fixture(scope="session")
def seaweedfs(tmp_path_factory) -> Iterator[SeaweedFS]:
    """A real SeaweedFS S3 server for the whole test session (started once, ~3 s; stopped
    with SIGTERM, a wait, then SIGKILL). Tests stay apart by making their own bucket."""
    if reason := seaweedfs_missing():
        pytest.skip(reason)
    server = start_seaweedfs(tmp_path_factory.mktemp("seaweedfs"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def s3_bucket(seaweedfs: SeaweedFS) -> str:
    """A fresh bucket of the session's SeaweedFS, named for the test."""
    name = f"t-{uuid.uuid4().hex[:12]}"
    seaweedfs.make_bucket(name)
    return name
