"""Disk blocks RLIMIT_FSIZE does not see: refused to code under limits, and more of them
to a frozen call.

RLIMIT_FSIZE is checked against a file's new size or a write's offset; what takes blocks
with neither goes past it. Two cases matter:

- Every call under limits: ``fallocate`` with ``FALLOC_FL_KEEP_SIZE`` (also with
  ``ZERO_RANGE`` or ``UNSHARE_RANGE``) allocates any amount without changing the size —
  ``fallocate -n -l 2G f`` took 3 ms under a 1 MiB file limit, so one call could fill the
  volume before the reaper's first walk. It fails with EOPNOTSUPP, as on a filesystem
  without it (callers fall back; ``posix_fallocate`` grows the size: checked). A punched
  hole (``PUNCH_HOLE | KEEP_SIZE``) frees, and is allowed. So do the ``ioctl``s that are
  that fallocate (``fs/ioctl.c``: ``FS_IOC_RESVSP``, ``RESVSP64``, ``ZERO_RANGE``, on
  any filesystem with fallocate — 32 MiB in one call under a 1 MiB quota, frozen or
  not); ``UNRESVSP`` punches a hole, allowed. ``io_uring`` (``IORING_OP_FALLOCATE``,
  no syscall to look at) answers ENOSYS — with the network ``allow`` or ``proxy_port``
  no socket filter refused it, and a call took 32 MiB so.
- A *frozen* call (its conversation over its quota when it started, ``runtime/reaper.py``)
  has RLIMIT_FSIZE 0: no ``write``, ``truncate`` past the end, growing ``fallocate``,
  ``copy_file_range`` or ``sendfile`` into a file succeeds. Each way below was one more
  burst at every such call (measured on ext4, in the 0.1 s before the first walk: 17 MiB
  of directories; a 1 MiB sparse file filled):

  - any ``fallocate`` but a punched hole (and its ``ioctl``s, as above);
  - a shared mapping of a file (``mmap`` ``MAP_SHARED`` of an fd) fills the holes of a
    sparse file page by page; an anonymous shared mapping (``multiprocessing``) is
    fine. Read-only shared mappings go too: ``mprotect`` adds write to one of an fd
    opened read-write;
  - names take directory blocks (which ext4 never gives back while the directory
    lives), a directory one of its own, a long symlink one: ``mkdir``, ``mknod``,
    ``symlink``, ``link``, ``rename`` fail; a new file (``open`` with ``O_CREAT``, whose
    flags a filter could read but not whether the file exists: ``> /dev/null`` must
    work) is refused by a Landlock layer handling every ``MAKE_*`` right and granting
    none — EACCES, as Landlock answers; an existing file is opened and truncated as
    before;
  - extended attributes take a block per inode (``setxattr``…);
  - ``io_uring`` does all of the above without those syscalls: ENOSYS (callers fall
    back), as for every limited call.

  Those seccomp refusals are EFBIG, the errno of RLIMIT_FSIZE, so the answer is the
  quota's (``limits.frozen_outcome``). Deleting (``unlink``, ``rmdir``) and shrinking
  (``truncate``, ``ftruncate``, ``O_TRUNC``) stay: they are how code gets back under.

Contract: ``program(machine, frozen=…)`` is the seccomp filter of each case; ``deny(frozen=…)``
installs the first (and for a frozen call the second, and the Landlock layer when the
kernel has Landlock) on the calling thread and what it starts (irreversible), where
``seccomp.available()``.
"""

from __future__ import annotations

import errno
import os
import platform

from . import landlock, seccomp
from .seccomp import _ALU_AND_K, _ARG0, _JEQ_K, _LD_W_ABS, _RET_ALLOW, _RET_ERRNO, _RET_K, _insn

_MAKE_ANY = (
    landlock.FS_MAKE_CHAR | landlock.FS_MAKE_DIR | landlock.FS_MAKE_REG | landlock.FS_MAKE_SOCK
    | landlock.FS_MAKE_FIFO | landlock.FS_MAKE_BLOCK | landlock.FS_MAKE_SYM
)  # fmt: skip
_KEEP_SIZE, _PUNCH_HOLE = 0x01, 0x02
_MAP_SHARED, _MAP_ANONYMOUS = 0x01, 0x20  # MAP_SHARED_VALIDATE (0x03) has the 0x01 bit
# ioctl commands that are fallocate(KEEP_SIZE | mode): _IOW('X', nr, struct space_resv),
# 48 bytes — FS_IOC_RESVSP (40), FS_IOC_RESVSP64 (42), FS_IOC_ZERO_RANGE (57). The
# UNRESVSP ones (41, 43) punch a hole: allowed. (ioctl's cmd is 32 bits: the low word.)
_PREALLOCATE_IOCTLS = tuple(0x40305800 | nr for nr in (40, 42, 57))

# Per architecture: the syscalls refused outright, those refused when an argument says
# so (name → number, argument index), and those that answer ENOSYS.
_X86_64 = {
    "deny": (83, 258, 133, 259, 88, 266, 86, 265, 82, 264, 316, 188, 189, 190, 463),
    # mkdir mkdirat mknod mknodat symlink symlinkat link linkat rename renameat
    # renameat2 setxattr lsetxattr fsetxattr setxattrat
    "fallocate": (285, 1),  # fallocate(fd, mode, …)
    "mmap": (9, 3),  # mmap(addr, length, prot, flags, …)
    "ioctl": (16, 1),  # ioctl(fd, cmd, …)
    "enosys": (425, 426, 427),  # io_uring_setup/enter/register
}
_AARCH64 = {
    "deny": (34, 33, 36, 37, 38, 276, 5, 6, 7, 463),
    # mkdirat mknodat symlinkat linkat renameat renameat2 setxattr lsetxattr fsetxattr
    # setxattrat
    "fallocate": (47, 1),
    "mmap": (222, 3),
    "ioctl": (29, 1),
    "enosys": (425, 426, 427),
}
_TABLES = {"x86_64": _X86_64, "aarch64": _AARCH64}


def program(machine: str | None = None, *, frozen: bool) -> bytes:
    """The filter for ``machine`` (default: this one), as ``struct sock_filter``s: for
    every limited call, or (``frozen``) for one that started over its quota."""
    machine = machine or platform.machine()
    table = _TABLES[machine]
    audit_arch = seccomp._ARCHES[machine][0]
    efbig, enosys = _RET_ERRNO | errno.EFBIG, _RET_ERRNO | errno.ENOSYS
    # Checks of one argument: (number, argument, mask, value refused, verdict then).
    nr, arg = table["fallocate"]
    # fallocate with KEEP_SIZE by ioctl (``fs/ioctl.c``, any filesystem with fallocate)
    ioctl = (*table["ioctl"], 0xFFFFFFFF, _PREALLOCATE_IOCTLS)
    if not frozen:
        unsupported = _RET_ERRNO | errno.EOPNOTSUPP
        keep = (nr, arg, _KEEP_SIZE | _PUNCH_HOLE, (_KEEP_SIZE,), unsupported)
        # io_uring: fallocate (IORING_OP_FALLOCATE) without the syscall looked at here
        no_uring = [(n, enosys) for n in table["enosys"]]
        return _assemble(audit_arch, [], no_uring, [keep, (*ioctl, unsupported)])
    checks = [
        (nr, arg, _PUNCH_HOLE, (0,), efbig),  # no hole punched: refused
        (*table["mmap"], _MAP_SHARED | _MAP_ANONYMOUS, (_MAP_SHARED,), efbig),  # a file's
        (*ioctl, efbig),
    ]
    return _assemble(
        audit_arch, [(n, efbig) for n in table["deny"]], [(n, enosys) for n in table["enosys"]],
        checks,
    )  # fmt: skip


def _assemble(
    audit_arch: int,
    deny: list[tuple[int, int]],
    enosys: list[tuple[int, int]],
    checks: list[tuple[int, int, int, tuple[int, ...], int]],
) -> bytes:
    """Classic BPF jumps only forward: one jump per syscall number to its check or its
    verdict, then allow; each check (load the argument's low 32 bits, mask it, compare
    with each value refused: one → its verdict, none → allow); the verdicts. A syscall
    has one check: its first."""
    refusals = deny + enosys
    # load, and, a comparison per value, allow, verdict
    lengths = [4 + len(values) for _, _, _, values, _ in checks]
    check_at = len(refusals) + len(checks) + 1
    verdict_at = check_at + sum(lengths)
    body: list[bytes] = []
    for index, (nr, _) in enumerate(refusals):
        body.append(_insn(_JEQ_K, nr, jt=verdict_at + index - len(body) - 1))
    for index, (nr, *_) in enumerate(checks):
        start = check_at + sum(lengths[:index])
        body.append(_insn(_JEQ_K, nr, jt=start - len(body) - 1))
    body.append(_insn(_RET_K, _RET_ALLOW))
    for _, arg, mask, values, verdict in checks:
        body.append(_insn(_LD_W_ABS, _ARG0 + 8 * arg))
        body.append(_insn(_ALU_AND_K, mask))
        for index, value in enumerate(values):  # → the verdict, past the rest and allow
            body.append(_insn(_JEQ_K, value, jt=len(values) - index))
        body.append(_insn(_RET_K, _RET_ALLOW))
        body.append(_insn(_RET_K, verdict))
    body.extend(_insn(_RET_K, verdict) for _, verdict in refusals)
    return b"".join(seccomp.native_only(audit_arch) + body)


def deny(*, frozen: bool) -> None:
    """For this thread and its future children (irreversible), when the kernel takes
    filters: no preallocation past RLIMIT_FSIZE; ``frozen``, no new name and no block at
    all past RLIMIT_FSIZE 0 either (see the module contract)."""
    if frozen and landlock.abi_version() >= 1:
        ruleset = landlock.build_ruleset(landlock.Policy(_MAKE_ANY), [])
        try:
            landlock.restrict_self(ruleset)
        finally:
            os.close(ruleset)
    if not seccomp.available():
        seccomp.install(program(frozen=False))
        if frozen:
            seccomp.install(program(frozen=True))
