"""One execution's process tree: the reaper that owns it and the code process it starts.

Runs inside a process the spawner forked (single-threaded, so Python after fork is safe).

Contract of ``run_call`` (never returns):
- The reaper makes itself a child subreaper (``PR_SET_CHILD_SUBREAPER``): every process
  the code starts and orphans — ``setsid``, double fork, ``nohup … &`` — is re-parented to
  it, so it always knows the whole tree. It dies with the spawner (SIGTERM on parent
  death, then it cleans up as below).
- It forks the code process, which, before ``execve``: starts a new session; gets the
  passed fds as 0, 1, 2, 3… and nothing else open; moves to ``cwd``; sets
  ``RLIMIT_NPROC`` (non-root; a root spawner joined the pids cgroup instead); dies with
  the reaper; switches uid if asked; and it is under the conversation's Landlock
  ruleset (its own conversation and scratch read-write, the system read-only). A failure in any step
  is reported and nothing runs unconfined.
- It writes one JSON line to ``report_fd``: ``{"pid": …, "start": …}`` (the code
  process's start time, ``pids.start_time``; with ``"frozen": bytes`` when the call
  started over its conversation's quota) or ``{"error": …}``.
- A call whose conversation is over its quota when it starts (the baseline walk, made
  before the fork) is *frozen*: the code process gets RLIMIT_FSIZE 0, soft and hard, so
  no write to a file succeeds in its whole tree (EFBIG; SIGXFSZ kills a shell tool) and
  no process of it can lift that, and a seccomp filter and a Landlock layer refuse the
  ways to blocks that limit does not see (``runtime/growth.py``: new names, fallocate,
  shared mappings of files, xattrs, io_uring); unlink and truncate still work, so code can get back
  under the quota, and the next call is not frozen. Without it, code that wrote a burst
  past the quota and ended before the first walk was told, but kept the bytes and did
  it again at every call.
- With ``limits`` in the request (``runtime/limits.py``) the code process gets its
  rlimits and ``oom_score_adj`` (and no ``fallocate`` with KEEP_SIZE, which RLIMIT_FSIZE
  does not see: ``runtime/growth.py``), and the reaper checks the tree every tick; past a
  limit it kills the tree and writes a second line ``{"limit": name}``; so too
  ``{"limit": "conversation"}`` when a last walk, once the code process ended, finds
  the conversation grew past its quota since the call began; so too
  ``{"limit": "oom"}`` when the kernel's OOM killer took the code process (the pod's
  memory limit: ``limits.killed_by_oom``).
- When the code process ends, or on SIGTERM (kill this call), it kills every remaining
  descendant — looping until it has no child left — and exits with the code's status
  (its exit code, or 128 + signal number).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import resource
import signal
import time
from collections.abc import Callable
from typing import NoReturn

from . import growth, landlock, prctl, seccomp
from .limits import TICK_SECONDS, Limits, TreeWatch, apply_in_child, killed_by_oom, oom_kills
from .pids import start_time

_KILL_DEADLINE = 30.0


class _Stop(Exception):
    """SIGTERM: kill the whole call now."""


class _LimitHit(Exception):
    """The tree went past one of its limits (the argument names which): kill it."""


# Whether a limit check may still raise: off for good once the tree is being killed, so
# no tick interrupts the cleanup (a handler already pending when the timer stopped too).
_ARMED = [False]


def _on_term(*_: object) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # once is enough; never interrupt cleanup
    _ARMED[0] = False
    raise _Stop


def run_call(request: dict, fds: list[int], report_fd: int, config: dict, parent: int) -> NoReturn:
    status = 255
    try:
        status = _run(request, fds, report_fd, config, parent)
    finally:
        os._exit(status)


def _run(request: dict, fds: list[int], report_fd: int, config: dict, parent: int) -> int:
    signal.signal(signal.SIGTERM, _on_term)
    prctl.call(prctl.PR_SET_CHILD_SUBREAPER, 1)
    prctl.call(prctl.PR_SET_PDEATHSIG, signal.SIGTERM)
    root = None
    try:
        if os.getppid() != parent:  # the spawner died before we could ask to follow it
            raise _Stop
        # The disk baseline is walked before code starts: one walked while it ran took in
        # what code wrote meanwhile (into parts not walked yet) as already there.
        watch = _tree_watch(request, os.getpid())
        # Over the quota already: code gets RLIMIT_FSIZE 0, so it cannot add one more
        # burst (written and ended before the first walk) at every call.
        frozen = watch is not None and watch.over_quota
        err_r, err_w = os.pipe()
        root = os.fork()
        if root == 0:
            _exec_code(request, fds, err_w, config, frozen=frozen)
        os.close(err_w)
        for fd in fds:  # the code's ends only: stdout EOF must mean the code closed it
            os.close(fd)
        failure = _read_all(err_r)
        if failure:
            _report(report_fd, {"error": failure})
            return _exit_code(os.waitpid(root, 0)[1])
        _watch(watch)  # before the report: the runtime may signal at once
        ooms = oom_kills()
        # Its start time with its pid: the runtime signals this process, never a later
        # holder of the pid (``pids.send_signal``). Read while it is our unreaped child.
        started = {"pid": root, "start": start_time(root)}
        if frozen:
            started["frozen"] = watch.disk_start
        _report(report_fd, started, close=False)
        while True:
            child, status = os.waitpid(-1, 0)
            if child == root:
                _kill_descendants()
                if killed_by_oom(status, ooms):
                    _report(report_fd, {"limit": "oom"})
                elif watch is not None and watch.check_last() is not None:
                    # A last walk, the tree dead: code that wrote past the quota and
                    # ended before a tick's walk (20 MiB in 50 ms) was never told, and did
                    # it again at every call.
                    _report(report_fd, {"limit": "conversation"})
                return _exit_code(status)
    except _LimitHit as hit:
        status = _kill_descendants(root)
        _report(report_fd, {"limit": hit.args[0]})
        return _exit_code(status) if status is not None else 128 + signal.SIGKILL
    except _Stop:
        status = _kill_descendants(root)
        return _exit_code(status) if status is not None else 128 + signal.SIGKILL
    except ChildProcessError:
        return 255


def _exit_code(status: int) -> int:
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.WEXITSTATUS(status) if os.WIFEXITED(status) else 255


def _report(fd: int, message: dict, *, close: bool = True) -> None:
    with contextlib.suppress(OSError):
        os.write(fd, json.dumps(message).encode() + b"\n")
        if close:
            os.close(fd)


def _tree_watch(request: dict, me: int) -> TreeWatch | None:
    limits = Limits.from_wire(request.get("limits"))
    return None if limits is None else TreeWatch(me, request["read_write"], limits)


def _watch(watch: TreeWatch | None) -> None:
    """Check the tree against its limits every tick (SIGALRM interrupts the wait);
    SIGUSR1 from the runtime starts a new execution's accounting (a Python cell)."""
    if watch is None:
        return
    _ARMED[0] = True
    signal.signal(signal.SIGUSR1, lambda *_: watch.reset())
    signal.signal(signal.SIGALRM, tick_handler(watch))
    signal.setitimer(signal.ITIMER_REAL, TICK_SECONDS, TICK_SECONDS)


def tick_handler(watch: TreeWatch) -> Callable[..., None]:
    """The SIGALRM handler: the tree's memory and CPU every tick, its disk size when due;
    ``_LimitHit`` past a limit.

    Python runs a handler between any two bytecodes, the handler's own included. So a
    tick that arrives during a disk walk (seconds on a big tree, loaded) checks memory and
    CPU all the same — a slow walk never pauses those limits — and starts no second walk;
    one that arrives during a memory and CPU check is dropped. Nesting is then at most
    two deep: without the guards a check slower than a tick started again inside itself
    every tick until the reaper died (the execution ended with status 255, its output
    lost)."""
    fast, disk = [False], [False]

    def guarded(flag: list[bool], check: Callable[[], str | None]) -> None:
        flag[0] = True
        try:
            hit = check()
        finally:
            flag[0] = False
        if hit is not None and _ARMED[0]:
            _ARMED[0] = False
            raise _LimitHit(hit)

    def on_tick(*_: object) -> None:
        if not _ARMED[0] or fast[0]:
            return
        guarded(fast, watch.check_fast)
        if not disk[0] and _ARMED[0] and watch.disk_due():
            guarded(disk, watch.check_disk)

    return on_tick


def _read_all(fd: int) -> str:
    chunks = []
    while chunk := os.read(fd, 4096):
        chunks.append(chunk)
    os.close(fd)
    return b"".join(chunks).decode(errors="replace")


def _kill_descendants(root: int | None = None) -> int | None:
    """SIGKILL every descendant until none is left; returns ``root``'s status if reaped."""
    _ARMED[0] = False  # no limit check may interrupt the cleanup
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.setitimer(signal.ITIMER_REAL, 0)
    root_status = None
    deadline = time.monotonic() + _KILL_DEADLINE
    me = os.getpid()
    # Direct children first (cheap, and nothing left is the common case), then the whole
    # tree per round: a forking process must not outrun a generation-by-generation kill.
    scan = _children
    while time.monotonic() < deadline:
        targets = scan(me)
        scan = _descendants
        for pid in targets:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        try:
            # Block only when something was killed; otherwise a child we did not see yet
            # (it forked during the scan) is found by the next round.
            child, status = os.waitpid(-1, 0 if targets else os.WNOHANG)
            while child:
                if child == root:
                    root_status = status
                child, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:  # no child left: no descendant either (we are subreaper)
            return root_status
    return root_status


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(p) for p in f.read().split()]
    except OSError:
        return _descendants(pid)


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid``, from one scan of /proc (parents via /proc/N/stat)."""
    kids: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        # The command name may hold spaces and parentheses: fields start after the last ')'.
        ppid = int(stat.rsplit(b")", 1)[1].split()[1])
        kids.setdefault(ppid, []).append(int(entry))
    found, stack = [], [pid]
    while stack:
        for child in kids.get(stack.pop(), ()):
            found.append(child)
            stack.append(child)
    return found


def _exec_code(
    request: dict, fds: list[int], err_w: int, config: dict, *, frozen: bool = False
) -> NoReturn:
    try:
        os.setsid()
        if request.get("cpu_cgroup"):  # the conversation's CPU share (root, cgroup v1)
            with (
                contextlib.suppress(OSError),
                open(request["cpu_cgroup"] + "/cgroup.procs", "w") as f,
            ):
                f.write(str(os.getpid()))
        limits = Limits.from_wire(request.get("limits"))
        if limits is not None:  # before Landlock: /proc/self/oom_score_adj is read-only then
            apply_in_child(limits, cpu_rlimit=request.get("cpu_rlimit", False), frozen=frozen)
        # Confined first: the fd shuffle below closes the ruleset's fd.
        if request.get("ruleset") is not None:  # built once per conversation by the spawner
            landlock.restrict_self(request["ruleset"])
        if config.get("deny_sockets"):  # network denied: no UDP, unix, raw… (seccomp)
            # Network "proxy": IPv4 too, in a namespace whose one way out is the relay.
            seccomp.deny_sockets(inet=bool(config.get("inet")))
        if limits is not None:  # no block past RLIMIT_FSIZE (frozen: no new name either)
            growth.deny(frozen=frozen)

        for sig in (signal.SIGTERM, signal.SIGPIPE, signal.SIGXFSZ, signal.SIGCHLD):
            signal.signal(sig, signal.SIG_DFL)
        # Move everything out of the way, then place the code's fds at 0, 1, 2, 3…
        err_w = fcntl.fcntl(err_w, fcntl.F_DUPFD_CLOEXEC, 256)
        moved = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 256) for fd in fds]
        for target, fd in enumerate(moved):
            os.dup2(fd, target, inheritable=True)
        # Landlock does not restrict fds already open: nothing else may survive the exec.
        os.closerange(len(moved), err_w)
        os.closerange(err_w + 1, resource.getrlimit(resource.RLIMIT_NOFILE)[1])
        os.chdir(request["cwd"])
        prctl.call(prctl.PR_SET_PDEATHSIG, signal.SIGKILL)
        if config.get("nproc"):
            resource.setrlimit(resource.RLIMIT_NPROC, (config["nproc"], config["nproc"]))
        if config.get("run_as"):
            uid, gid = config["run_as"]
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
        argv, env = request["argv"], request["env"]
        os.execvpe(argv[0], argv, env)
    except BaseException as e:
        with contextlib.suppress(BaseException):
            os.write(err_w, f"{type(e).__name__}: {e}".encode())
    os._exit(127)
