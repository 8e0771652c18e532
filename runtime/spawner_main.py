"""The spawner: the one process that starts code for the runtime (runs as its own process).

Why a separate process: the runtime is multi-threaded, so it may not run Python between
fork and exec; this process is single-threaded, small and started once, so forking it
costs well under a millisecond and its children may run Python (Landlock set-up, the
reaper's loop) before exec — no interpreter start-up per call.

Protocol (``SOCK_SEQPACKET``, one JSON object per message, fds by ``SCM_RIGHTS``):
  runtime → spawner  {"op": "spawn", "id", "cid", "argv", "env", "cwd", "read_write",
                      "read_only"?} + fds
                     {"op": "kill", "id"}            kill one call's whole tree
                     {"op": "stop", "id", "cid"}     kill every call of a conversation
                     {"op": "configure", "config"}   config changes for calls to come
                                     (a pooled runtime's claim; ignored once a call ran)
  spawner → runtime  {"op": "started", "id", "pid", "start", "reaper", "reaper_start",
                      "frozen"}      (start times: ``pids.start_time``; frozen: the
                                     conversation's size when the call started over
                                     its quota, else null — ``runtime/reaper.py``)
                     {"op": "failed", "id", "error", "ceiling"?}  (ceiling: fork
                                     failed with EAGAIN, the process ceiling is full)
                     {"op": "exited", "id", "code", "limit"}  (code: exit status, 128 +
                                     signal; limit: the limit the reaper killed it for)
                     {"op": "stopped", "id"}         every call of that cid has ended
Each call is a reaper process (``runtime/reaper.py``) that owns the code's process tree.
This process is a child subreaper too: should a reaper die unexpectedly, its orphans come
here and are killed. When the runtime goes (socket EOF, or SIGTERM on its death), every
call is killed before this process exits. The configuration (``Confinement.
spawner_config``) comes as JSON in ``SBW_SPAWNER_CONFIG``.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import select
import signal
import socket
import sys
import time

from . import landlock, prctl, reaper
from .pids import start_time

_MAX_MESSAGE = 1 << 20
_MAX_FDS = 16
_REPORT_TIMEOUT = 30.0


class Spawner:
    def __init__(self, sock: socket.socket, config: dict) -> None:
        self.sock = sock
        self.config = config
        self.calls: dict[int, tuple[int, str]] = {}  # reaper pid → (call id, cid)
        self.by_id: dict[int, int] = {}  # call id → reaper pid
        self.reports: dict[int, int] = {}  # reaper pid → its report pipe (a limit it hit)
        self.waiting_stop: dict[str, list[int]] = {}  # cid → stop request ids
        self.wake_r, self.wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        # cid → (read-write paths, Landlock ruleset fd): built once, reused by every call.
        self.rulesets: dict[str, tuple[list, int]] = {}
        self.running = True

    def send(self, message: dict) -> None:
        with contextlib.suppress(OSError):  # the runtime is gone: shutdown follows
            self.sock.send(json.dumps(message).encode())

    def serve(self) -> None:
        signal.set_wakeup_fd(self.wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.signal(signal.SIGTERM, self._on_term)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        while self.running:
            readable, _, _ = select.select([self.sock, self.wake_r], [], [])
            if self.wake_r in readable:
                with contextlib.suppress(BlockingIOError):
                    while os.read(self.wake_r, 512):
                        pass
                self.reap()
            if self.sock in readable:
                self.receive()
        self.shutdown()

    def _on_term(self, *_: object) -> None:
        self.running = False

    def receive(self) -> None:
        try:
            data, fds, _, _ = socket.recv_fds(self.sock, _MAX_MESSAGE, _MAX_FDS)
        except OSError:
            data, fds = b"", []
        if not data:
            self.running = False
            return
        message = json.loads(data)
        op = message.get("op")
        if op == "spawn":
            self.spawn(message, fds)
            return
        for fd in fds:
            os.close(fd)
        if op == "configure":
            # A pooled runtime's claim, before any call: the network of calls to come.
            # Cached rulesets hold the old rules, so none may exist (nothing ran yet).
            if not self.calls and not self.rulesets:
                self.config.update(message["config"])
        elif op == "kill":
            self.signal_reaper(self.by_id.get(message["id"]))
        elif op == "stop":
            self.forget(message["cid"])
            reapers = [pid for pid, (_, cid) in self.calls.items() if cid == message["cid"]]
            if not reapers:
                self.send({"op": "stopped", "id": message["id"]})
                return
            self.waiting_stop.setdefault(message["cid"], []).append(message["id"])
            for pid in reapers:
                self.signal_reaper(pid)

    def signal_reaper(self, pid: int | None) -> None:
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)

    def ruleset(self, cid: str, read_write: list[str]) -> int | None:
        if not self.config.get("landlock"):
            return None
        # Rules hold inodes: a directory deleted and made again needs a new ruleset.
        key = [(path, *_identity(path)) for path in read_write]
        cached = self.rulesets.get(cid)
        if cached is not None and cached[0] == key:
            return cached[1]
        self.forget(cid)
        rules = [tuple(rule) for rule in self.config["read_only"]]
        rules += [(path, self.config["read_write"]) for path in read_write]
        fd = landlock.build_ruleset(
            landlock.Policy(*self.config["policy"]),
            rules,
            connect_ports=self.config.get("connect_ports", ()),
        )
        self.rulesets[cid] = (key, fd)
        return fd

    def call_ruleset(self, message: dict) -> int:
        """A call's own ruleset (see runtime/readonly.py): its read-write entries are
        taken as they are now, never through a symlink, and the ``read_only`` paths get
        only the read rights — so the conversation directory itself is read-only."""
        read = landlock.FS_READ
        rules = [tuple(rule) for rule in self.config["read_only"]]
        rules += [(path, read) for path in message["read_only"]]
        mine = [(path, self.config["read_write"]) for path in message["read_write"]]
        return landlock.build_ruleset(
            landlock.Policy(*self.config["policy"]),
            rules,
            mine,
            connect_ports=self.config.get("connect_ports", ()),
        )

    def forget(self, cid: str) -> None:
        cached = self.rulesets.pop(cid, None)
        if cached is not None:
            os.close(cached[1])

    def spawn(self, message: dict, fds: list[int]) -> None:
        own = None  # a ruleset for this call alone (read-only entries), closed after fork
        try:
            if message.get("read_only") and self.config.get("landlock"):
                own = message["ruleset"] = self.call_ruleset(message)
            else:
                message["ruleset"] = self.ruleset(message["cid"], message["read_write"])
        except OSError as e:  # nothing runs unconfined: the call fails instead
            for fd in fds:
                os.close(fd)
            self.send({"op": "failed", "id": message["id"], "error": f"Landlock: {e}"})
            return
        me = os.getpid()
        try:
            report_r, report_w = os.pipe()
            try:
                pid = os.fork()
            except OSError:
                os.close(report_r)
                os.close(report_w)
                raise
        except OSError as e:
            # Code at its process ceiling (a fork bomb holding RLIMIT_NPROC of the uid we
            # share) makes fork fail here: that call fails, the spawner lives on.
            for fd in fds:
                os.close(fd)
            if own is not None:
                os.close(own)
            failed = {"op": "failed", "id": message["id"], "error": f"cannot fork: {e}"}
            if e.errno == errno.EAGAIN:  # the process ceiling, not a broken runtime
                failed["ceiling"] = True
            self.send(failed)
            return
        if pid == 0:
            os.close(report_r)
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            for fd in (self.sock.fileno(), self.wake_r, self.wake_w):
                os.close(fd)
            reaper.run_call(message, fds, report_w, self.config, me)
        os.close(report_w)
        for fd in fds:
            os.close(fd)
        if own is not None:
            os.close(own)
        report = _read_report(report_r)
        if "pid" in report:
            self.calls[pid] = (message["id"], message["cid"])
            self.by_id[message["id"]] = pid
            self.reports[pid] = report_r
            # The reaper is our unreaped child: its start time is surely its own.
            started = {"pid": report["pid"], "start": report.get("start"), "reaper": pid,
                       "reaper_start": start_time(pid), "frozen": report.get("frozen")}  # fmt: skip
            self.send({"op": "started", "id": message["id"], **started})
        else:
            os.close(report_r)
            # The reaper exits on its own; it is reaped (and ignored) like an orphan.
            self.send({"op": "failed", "id": message["id"], "error": report.get("error", "")})

    def reap(self) -> None:
        stray = False
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            entry = self.calls.pop(pid, None)
            if entry is None:
                continue
            call_id, cid = entry
            self.by_id.pop(call_id, None)
            limit = _read_limit(self.reports.pop(pid))
            code = reaper._exit_code(status)
            self.send({"op": "exited", "id": call_id, "code": code, "limit": limit})
            stray |= os.WIFSIGNALED(status)  # a reaper killed outright left orphans here
            if cid in self.waiting_stop and not any(c == cid for _, c in self.calls.values()):
                for request in self.waiting_stop.pop(cid):
                    self.send({"op": "stopped", "id": request})
        if stray:
            self.kill_strays()

    def kill_strays(self) -> None:
        """Kill what is ours but not a reaper: orphans of a reaper that died."""
        for pid in reaper._descendants(os.getpid()):
            if pid not in self.calls:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)

    def shutdown(self) -> None:
        for pid in list(self.calls):
            self.signal_reaper(pid)
        deadline = time.monotonic() + 60.0
        while time.monotonic() < deadline:
            try:
                os.waitpid(-1, 0)
            except ChildProcessError:
                return
            self.kill_strays()


def _identity(path: str) -> tuple[int, int]:
    try:
        st = os.stat(path)
    except OSError:
        return (0, 0)
    return (st.st_dev, st.st_ino)


def _read_report(fd: int) -> dict:
    """The reaper's first line; ``fd`` stays open (a second line may name a limit)."""
    data = b""
    deadline = time.monotonic() + _REPORT_TIMEOUT
    while time.monotonic() < deadline and not data.endswith(b"\n"):
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            break
        chunk = os.read(fd, 1)  # byte by byte: never past the first line
        if not chunk:
            break
        data += chunk
    try:
        return json.loads(data)
    except ValueError:
        return {"error": "the reaper ended before starting the code"}


def _read_limit(fd: int) -> str | None:
    """What a reaped reaper wrote after its first line (it is gone: no read blocks)."""
    try:
        os.set_blocking(fd, False)
        data = os.read(fd, 4096)
    except OSError:
        data = b""
    finally:
        os.close(fd)
    with contextlib.suppress(ValueError, AttributeError):
        return json.loads(data).get("limit")
    return None


def main() -> None:
    prctl.call(prctl.PR_SET_CHILD_SUBREAPER, 1)
    prctl.call(prctl.PR_SET_DUMPABLE, 0)
    prctl.call(prctl.PR_SET_PDEATHSIG, signal.SIGTERM)
    fd, parent = int(sys.argv[1]), int(sys.argv[2])
    sock = socket.socket(fileno=fd)
    config = json.loads(os.environ.pop("SBW_SPAWNER_CONFIG"))
    if config.get("cgroup"):
        # Joined once here, inherited by every reaper and code process: joining a cgroup-v1
        # hierarchy costs ~10 ms (an RCU grace period), too much for every call.
        with open(os.path.join(config["cgroup"], "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))
    spawner = Spawner(sock, config)
    if os.getppid() != parent:  # the runtime died before we could ask to follow it
        return
    spawner.serve()


if __name__ == "__main__":
    main()
