"""Limits of one execution: what a code process gets before exec, and what its reaper
watches while it runs (``runtime/reaper.py``).

Why these mechanisms: a sandbox pod has no CAP_SYS_ADMIN (no cgroup of its own, no
mount, no quota), so everything here is what an unprivileged process can do to its own
children — rlimits, which the kernel enforces exactly per process, and accounting the
reaper does itself for the whole tree (it is the tree's subreaper, so it knows every
process, ``setsid`` and double forks included). The pod's own cgroup limit stays the
outer wall; ``oom_score_adj`` 1000 on every code process makes code, never the runtime,
what the OOM killer takes when that wall is hit.

Contract:
- ``Limits.from_wire(d)`` / ``to_wire()``: the plain dict a spawn request carries
  (``None`` when the runtime has no limits).
- ``apply_in_child(limits, cpu_rlimit, frozen)`` — in the code process before exec:
  RLIMIT_AS (memory: a Python allocation past it raises MemoryError and the interpreter
  lives on), RLIMIT_FSIZE (file size: a write past it fails with EFBIG, SIGXFSZ kills a
  shell tool; ``frozen``, a call that starts over the conversation's quota: 0, soft and
  hard — no write to any file succeeds and nothing unprivileged raises it again, while
  unlink and truncate work), RLIMIT_CPU when ``cpu_rlimit`` (a fresh process per call:
  bash), ``oom_score_adj`` 1000 and nice 5 (raising either needs no privilege).
- ``TreeWatch(root_pid, paths, limits)``: ``check_fast()`` → ``memory`` or ``cpu`` when
  the tree is past one (milliseconds), ``check_disk()`` → ``conversation`` (a walk, as long
  as the tree is big; ``disk_due()`` says when the next one is), else None;
  ``check_last()``: the same once code ended (for a tree slow to walk, only when
  ``statvfs`` says the filesystem grew by more than the room left); ``reset()`` starts a
  new execution's CPU and growth accounting (the runtime signals it at each Python cell).
  Memory is the tree's anonymous resident memory (a forked child's copy-on-write pages
  count in both: conservative); CPU is user + system time of every process that ever
  ran in the tree since ``reset`` (live ones from /proc, reaped ones from their
  parents' children times and the reaper's own); the conversation's size is the disk
  blocks under ``paths`` (hard links once) and of the files the tree unlinked and holds
  open (``runtime/held.py``), checked every ``DISK_SECONDS`` (longer when a walk is
  slow), and only growth past the quota kills — code can always delete to get back
  under it. Growth counts from the size walked when the watch is made (before the
  code process starts); ``reset`` walks nothing, the next walk judges against the old
  baseline and then becomes the new one. ``over_quota``: that first walk found the
  conversation over its quota already — the call is frozen, so a burst written and
  ended before the first walk (told by ``check_last``, but the bytes stay) happens once,
  not at every call.
- ``frozen_outcome(error, exit_code, limits, used)``: a frozen call's refused write
  (EFBIG, a tool killed by SIGXFSZ) is ``conversation_quota_exceeded``, with a message
  telling to delete files (``over_quota_error``), not ``file_too_large``.
- ``oom_kills()`` → the kernel's count of OOM kills this process can see (the
  container's memory cgroup when mounted, else the machine's); ``killed_by_oom(status,
  before)``: the code process died of a SIGKILL nobody in the runtime sent while that
  count rose — the pod's memory limit (the outer wall) was hit and the kernel took code,
  as ``oom_score_adj`` asks: ``oom`` (memory_limit_exceeded), not a crash of unknown cause.
- ``REASONS`` maps a limit name to the result code the API answers.
"""

from __future__ import annotations

import contextlib
import errno
import os
import resource
import signal
import stat
import time
from dataclasses import asdict, dataclass

from . import prctl, tree
from .held import unlinked_blocks
from .schemas import ExecutionError

TICK_SECONDS = 0.1
# Disk usage every 0.5 s, or 20 walks' time when the tree is large enough that a walk
# takes longer than 25 ms: measuring never costs more than ~5% of a core.
DISK_SECONDS = 0.5
DISK_COST_FACTOR = 20
# A last walk once code ended is always made when the first one took no longer than this.
CHEAP_WALK_SECONDS = 0.02
OOM_SCORE_ADJ = 1000
NICE = 5  # the runtime and the API answer first when code keeps every core busy
REASONS = {
    "memory": "memory_limit_exceeded",
    "session_memory": "memory_limit_exceeded",
    "oom": "memory_limit_exceeded",
    "cpu": "cpu_limit_exceeded",
    "file_size": "file_too_large",
    "conversation": "conversation_quota_exceeded",
}
# Where the kernel counts OOM kills, the container's own first: cgroup v2, cgroup v1 (runc
# mounts the container's memory cgroup there), then the whole machine (Linux >= 4.13).
OOM_COUNTERS = (
    ("/sys/fs/cgroup/memory.events", b"oom_kill"),
    ("/sys/fs/cgroup/memory/memory.oom_control", b"oom_kill"),
    ("/proc/vmstat", b"oom_kill"),
)
_PAGE = os.sysconf("SC_PAGE_SIZE")
_TICK = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Limits:
    memory: int  # bytes
    cpu_seconds: int
    file_size: int  # bytes
    conversation_size: int  # bytes

    @classmethod
    def from_wire(cls, data: dict | None) -> Limits | None:
        return cls(**data) if data else None

    def to_wire(self) -> dict:
        return asdict(self)


def apply_in_child(limits: Limits, *, cpu_rlimit: bool, frozen: bool = False) -> None:
    """Runs in the forked code process before exec (see the module contract)."""
    # The runtime and spawner are not dumpable, and a non-dumpable process's /proc/self
    # files belong to root: as uid 10001 in a pod the write below fails with EACCES (the
    # node tier caught it; as root it passes). This child execs code in a moment, and
    # execve makes it dumpable anyway; meanwhile no confined code can reach it (Landlock
    # refuses ptrace and /proc/<pid>/mem outside a process's own domain).
    prctl.call(prctl.PR_SET_DUMPABLE, 1)
    with open("/proc/self/oom_score_adj", "w") as f:
        f.write(str(OOM_SCORE_ADJ))
    prctl.call(prctl.PR_SET_DUMPABLE, 0)
    os.nice(NICE)
    resource.setrlimit(resource.RLIMIT_AS, (limits.memory, limits.memory))
    # Over the quota when the call starts: no write to any file at all (the limit is on
    # the write's offset, so overwriting in place fails too), soft and hard, so neither
    # code nor a child of it can raise it again. Unlink and truncate still work.
    file_size = 0 if frozen else limits.file_size
    resource.setrlimit(resource.RLIMIT_FSIZE, (file_size, file_size))
    if cpu_rlimit:
        # SIGXCPU at the soft limit, SIGKILL a second later should it be caught.
        resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_seconds, limits.cpu_seconds + 1))


class TreeWatch:
    """Made before the code process starts: its disk baseline is then exact — one walked
    while code ran took what code wrote meanwhile (into parts not walked yet) as already
    there, and code that made the walk slow (many empty files) grew past the quota by as
    much at every call."""

    def __init__(self, reaper_pid: int, paths: list[str], limits: Limits) -> None:
        self.reaper_pid = reaper_pid
        self.paths = paths
        self.limits = limits
        self.next_disk = 0.0
        self.cpu_start = self._cpu(self._tree())
        self.fs_start = filesystem_used(paths)
        self.devices = _devices(paths)
        began = time.monotonic()
        self.disk_start = disk_usage(paths)
        self.walk_seconds = time.monotonic() - began
        self.rebase = False

    @property
    def over_quota(self) -> bool:
        """The conversation was over its quota before code started: the call is frozen
        (``apply_in_child(frozen=True)``)."""
        return self.disk_start > self.limits.conversation_size

    def reset(self) -> None:
        """A new execution (a Python cell, SIGUSR1): its CPU counts from now, and the next
        walk's size is its disk baseline. No walk here: in a signal handler a walk could
        nest in itself (cells faster than a walk of seconds) and took in what the
        kernel's background code wrote meanwhile."""
        self.cpu_start = self._cpu(self._tree())
        self.rebase = True

    def check_fast(self) -> str | None:
        """Memory and CPU: a read of /proc per process of the tree (milliseconds)."""
        tree = self._tree()
        if self._memory(tree) > self.limits.memory:
            return "memory"
        if self._cpu(tree) - self.cpu_start > self.limits.cpu_seconds:
            return "cpu"
        return None

    def disk_due(self) -> bool:
        return time.monotonic() >= self.next_disk

    def check_disk(self) -> str | None:
        """The conversation's size: a walk of its tree (as long as the tree is big)."""
        now = time.monotonic()
        fs = filesystem_used(self.paths)
        # With the blocks of files the tree unlinked and holds open: no walk sees them.
        used = disk_usage(self.paths) + unlinked_blocks(self._tree(), self.devices)
        spent = time.monotonic() - now
        self.next_disk = now + max(DISK_SECONDS, DISK_COST_FACTOR * spent)
        # Judged against the baseline before a rebase: growth past the quota since the
        # last measure kills, even across a cell's start (a cell does not forgive it).
        hit = used > self.limits.conversation_size and used > self.disk_start
        if self.rebase:
            self.disk_start, self.fs_start, self.rebase = used, fs, False
        return "conversation" if hit else None

    def check_last(self) -> str | None:
        """``check_disk`` once the code process has ended. A walk as cheap as
        ``CHEAP_WALK_SECONDS`` always runs; a slower one (a conversation of many files)
        only when the tree may have grown past the quota — not when the filesystems under
        ``paths`` grew by less than the room it had left (``statvfs``, O(1)), so such a
        conversation's commands pay no walk at their end. (Space freed elsewhere on the
        same filesystem meanwhile can hide growth from that look.)"""
        if self.walk_seconds > CHEAP_WALK_SECONDS:
            now = filesystem_used(self.paths)
            room = max(self.limits.conversation_size - self.disk_start, 0)
            if now is not None and self.fs_start is not None and now - self.fs_start <= room:
                return None
        return self.check_disk()

    def _tree(self) -> list[int]:
        return descendants(self.reaper_pid)

    @staticmethod
    def _memory(tree: list[int]) -> int:
        return anonymous_memory(tree)

    def _cpu(self, tree: list[int]) -> float:
        ticks = 0
        for pid in tree:
            with contextlib.suppress(OSError, ValueError, IndexError):
                with open(f"/proc/{pid}/stat", "rb") as f:
                    fields = f.read().rsplit(b")", 1)[1].split()
                # utime stime cutime cstime: fields 14-17, i.e. 11-14 after the name
                ticks += sum(int(x) for x in fields[11:15])
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)  # what the reaper reaped
        return ticks / _TICK + usage.ru_utime + usage.ru_stime


def descendants(root: int) -> list[int]:
    """Every process below ``root``, walking /proc/PID/task/*/children (O(tree))."""
    found, stack = [], [root]
    while stack:
        pid = stack.pop()
        for child in _children(pid):
            found.append(child)
            stack.append(child)
    return found


def anonymous_memory(pids: list[int]) -> int:
    """Resident memory of ``pids`` that is not file-backed (heap, stacks, shm), in bytes."""
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError, ValueError, IndexError):
            with open(f"/proc/{pid}/statm", "rb") as f:
                fields = f.read().split()
            total += (int(fields[1]) - int(fields[2])) * _PAGE  # resident - shared
    return total


def usage_by_call(spawner_pid: int) -> dict[int, int]:
    """Anonymous memory of each call's tree, by reaper pid (the spawner's children)."""
    return {reaper: anonymous_memory(descendants(reaper)) for reaper in _children(spawner_pid)}


def _children(pid: int) -> list[int]:
    found: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for tid in tasks:
        with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{tid}/children", "rb") as f:
            found.extend(int(p) for p in f.read().split())
    return found


def _devices(paths: list[str]) -> set[int]:
    found = set()
    for path in paths:
        with contextlib.suppress(OSError):
            found.add(os.stat(path).st_dev)
    return found


def filesystem_used(paths: list[str]) -> int | None:
    """Bytes in use on the filesystems holding ``paths`` (each counted once), or None."""
    try:
        devices = {os.stat(p).st_dev: p for p in paths}
        total = 0
        for path in devices.values():
            fs = os.statvfs(path)
            total += (fs.f_blocks - fs.f_bfree) * fs.f_frsize
        return total
    except OSError:
        return None


def disk_usage(paths: list[str]) -> int:
    """Bytes of disk blocks under ``paths`` (no symlink followed, hard links once), at any
    depth: the walk goes by directory descriptors (``tree.walk_entries``), so a tree
    deeper than PATH_MAX is counted in full and costs O(entries), not O(depth²) path
    lookups; a directory code made unreadable (``chmod 300``) is given its owner's r-x
    back and counted, not skipped — either was a way past the quota."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for path in paths:
        try:
            top = _open_reclaimed(path)
        except OSError:
            continue
        try:
            for st in tree.walk_entries(top, reclaim=True):
                # Links are counted once; one without blocks is not even remembered:
                # millions of linked empty files cost no quota, and a set of them cost
                # the reaper ~150 bytes each (blocks bound the rest: quota / 4 KiB).
                if st.st_nlink > 1 and st.st_blocks and not stat.S_ISDIR(st.st_mode):
                    key = (st.st_dev, st.st_ino)
                    if key in seen:
                        continue
                    seen.add(key)
                total += st.st_blocks * 512
        finally:
            os.close(top)
    return total


def _open_reclaimed(path: str) -> int:
    """``path`` opened, with its owner's r-x given back if code took them: its size is
    counted all the same."""
    head, name = os.path.split(os.path.normpath(path))
    # The parent is the runtime's own (it may be reached through a link): followed.
    parent = os.open(head or ".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        return tree.open_dir_accessible(parent, name, want=tree.READ_SEARCH)
    finally:
        os.close(parent)


def oom_kills(counters: tuple[tuple[str, bytes], ...] = OOM_COUNTERS) -> int | None:
    """The first readable OOM-kill counter of ``counters`` (None: none is)."""
    for path, key in counters:
        with contextlib.suppress(OSError, ValueError), open(path, "rb") as f:
            for line in f:
                name, _, value = line.partition(b" ")
                if name == key:
                    return int(value)
    return None


def killed_by_oom(status: int, before: int | None) -> bool:
    """Whether a code process that ended with wait ``status`` was the OOM killer's pick."""
    if not (os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL):
        return False
    after = oom_kills()
    return before is not None and after is not None and after > before


def size_text(n: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:g} {unit}"
    return f"{n} bytes"


def limit_error(name: str, limits: Limits | None, *, state_lost: bool) -> ExecutionError:
    """The error an execution ends with when it hit limit ``name``."""
    described = {
        "memory": ("MemoryLimitExceeded", f"memory above {size_text(limits.memory)}"),
        "cpu": ("CpuLimitExceeded", f"more than {limits.cpu_seconds} s of CPU time"),
        "file_size": ("FileTooLarge", f"a file larger than {size_text(limits.file_size)}"),
        "conversation": (
            "ConversationQuotaExceeded",
            f"the conversation's files above {size_text(limits.conversation_size)}",
        ),
    } if limits else {}  # fmt: skip
    described["session_memory"] = (
        "MemoryLimitExceeded",
        "the most memory when the session's code together went past its memory ceiling",
    )
    described["oom"] = (
        "MemoryLimitExceeded",
        "memory past the sandbox's own memory limit, so the kernel's OOM killer stopped it",
    )
    title, what = described.get(name, (f"{name.title()}LimitExceeded", "a limit"))
    scope = {"session_memory": "session", "oom": "sandbox"}.get(name, "execution")
    value = f"the execution was stopped: it used {what}, this sandbox's limit per {scope}"
    if state_lost:
        value += "; the interpreter was restarted and its state is lost"
    return ExecutionError(name=title, value=value, code=REASONS.get(name))


def over_quota_error(
    limits: Limits, used: int, cause: ExecutionError | str | None = None
) -> ExecutionError:
    """The error of a call that started over its conversation's quota (``used`` bytes
    then) and tried to write or create a file: every such attempt of the call fails.
    ``cause``: the error code ended with (kept in the message and the traceback), or
    how it ended."""
    value = (
        f"the conversation's files ({size_text(used)}) are over its quota of "
        f"{size_text(limits.conversation_size)}, so no file can be written, grow or be "
        "created: delete files first (deleting and truncating still work), then run the "
        "code again"
    )
    if isinstance(cause, ExecutionError):
        value += f" (the code's error: {cause.name}: {cause.value})"
    elif cause:
        value += f" ({cause})"
    traceback = cause.traceback if isinstance(cause, ExecutionError) else ""
    code = REASONS["conversation"]
    return ExecutionError(
        name="ConversationQuotaExceeded", value=value, traceback=traceback, code=code
    )


def frozen_outcome(
    error: ExecutionError | None, exit_code: int, limits: Limits | None, used: int | None
) -> ExecutionError | None:
    """The error of an execution that ended on its own, for a call that was frozen
    (``used``: the conversation's size when it started, None when it was not): a write
    refused by RLIMIT_FSIZE 0 or the growth filter (EFBIG, or a tool killed by SIGXFSZ)
    is the quota's doing, not a file's size; so is, most likely, a new file refused by
    the filter's Landlock layer (EACCES: the message keeps the code's own error, since a
    path outside the conversation is refused so too). A command that failed otherwise
    (a shell's ``> new`` says only "Permission denied") is answered so too, its exit
    status named: while the conversation is over its quota, every failure says so."""
    if used is None or limits is None:
        return error
    if error is None:
        if exit_code == 128 + signal.SIGXFSZ:
            return over_quota_error(limits, used)
        if exit_code != 0:
            return over_quota_error(limits, used, f"the command's exit status: {exit_code}")
        return error
    if error.value.startswith((f"[Errno {errno.EFBIG}]", f"[Errno {errno.EACCES}]")):
        return over_quota_error(limits, used, error)
    return error


def classify(
    error: ExecutionError | None, exit_code: int, limits: Limits | None
) -> ExecutionError | None:
    """The error of an execution that ended on its own, with the limit it hit if any:
    a Python MemoryError or EFBIG under the limits, a tool killed by SIGXFSZ/SIGXCPU."""
    if limits is None:
        return error
    if error is not None and error.code is None:
        if error.name == "MemoryError":
            return error.model_copy(update={"code": REASONS["memory"]})
        if error.value.startswith(f"[Errno {errno.EFBIG}]"):
            return error.model_copy(update={"code": REASONS["file_size"]})
        return error
    if error is None and exit_code == 128 + signal.SIGXFSZ:
        return limit_error("file_size", limits, state_lost=False)
    if error is None and exit_code == 128 + signal.SIGXCPU:
        return limit_error("cpu", limits, state_lost=False)
    return error
