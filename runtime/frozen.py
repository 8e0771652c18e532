"""What a frozen call may not do: the ways past RLIMIT_FSIZE 0 to more disk blocks.

A call that starts with its conversation over its quota is *frozen* (``runtime/reaper.py``):
its code gets RLIMIT_FSIZE 0, so no ``write``, ``truncate`` past the end, ``fallocate``
growing a file, ``copy_file_range`` or ``sendfile`` into a file succeeds. The kernel
checks that limit against a file's size or a write's offset, and these take blocks with
neither, so each was one more burst at every call (measured on ext4 and tmpfs, in the
0.1 s before the reaper's first walk: 17 MiB of directories; a 1 MiB sparse file filled):

- ``fallocate`` with ``FALLOC_FL_KEEP_SIZE`` allocates without changing the size (as
  ``ZERO_RANGE`` and ``UNSHARE_RANGE`` with it do); only ``PUNCH_HOLE``, which frees,
  is allowed.
- A shared mapping of a file (``mmap`` ``MAP_SHARED`` of an fd) fills the holes of a
  sparse file page by page; an anonymous shared mapping (``multiprocessing``) is fine.
  Read-only shared mappings go too: ``mprotect`` adds write to one of an fd opened
  read-write.
- Names take directory blocks (which ext4 never gives back while the directory lives),
  a directory one of its own, a long symlink one: ``mkdir``, ``mknod``, ``symlink``,
  ``link``, ``rename`` fail with EFBIG; a new file (``open`` with ``O_CREAT``, whose
  flags a filter could read but not whether the file exists: ``> /dev/null`` must work)
  is refused by a Landlock layer handling every ``MAKE_*`` right and granting none —
  EACCES, as Landlock answers; an existing file is opened and truncated as before.
- Extended attributes take a block per inode (``setxattr``…).
- ``io_uring`` does all of the above without those syscalls: ENOSYS (callers fall back).

The seccomp refusals are EFBIG, the errno of RLIMIT_FSIZE, so the answer is the quota's
(``limits.frozen_outcome``). Deleting (``unlink``, ``rmdir``) and shrinking (``truncate``,
``ftruncate``, ``O_TRUNC``) stay: they are how code gets back under.

Contract: ``program(machine)`` is the seccomp filter; ``deny_growth()`` installs the
Landlock layer (when the kernel has Landlock) and the filter (when
``seccomp.available()``) on the calling thread and what it starts (irreversible).
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
_PUNCH_HOLE = 0x02
_MAP_SHARED, _MAP_ANONYMOUS = 0x01, 0x20  # MAP_SHARED_VALIDATE (0x03) has the 0x01 bit

# Per architecture: the syscalls refused outright, those refused when an argument says
# so (name → number, argument index), and those that answer ENOSYS.
_X86_64 = {
    "deny": (83, 258, 133, 259, 88, 266, 86, 265, 82, 264, 316, 188, 189, 190, 463),
    # mkdir mkdirat mknod mknodat symlink symlinkat link linkat rename renameat
    # renameat2 setxattr lsetxattr fsetxattr setxattrat
    "fallocate": (285, 1),  # fallocate(fd, mode, …)
    "mmap": (9, 3),  # mmap(addr, length, prot, flags, …)
    "enosys": (425, 426, 427),  # io_uring_setup/enter/register
}
_AARCH64 = {
    "deny": (34, 33, 36, 37, 38, 276, 5, 6, 7, 463),
    # mkdirat mknodat symlinkat linkat renameat renameat2 setxattr lsetxattr fsetxattr
    # setxattrat
    "fallocate": (47, 1),
    "mmap": (222, 3),
    "enosys": (425, 426, 427),
}
_TABLES = {"x86_64": _X86_64, "aarch64": _AARCH64}


def program(machine: str | None = None) -> bytes:
    """The filter for ``machine`` (default: this one), as ``struct sock_filter``s."""
    machine = machine or platform.machine()
    table = _TABLES[machine]
    audit_arch = seccomp._ARCHES[machine][0]
    efbig, enosys = _RET_ERRNO | errno.EFBIG, _RET_ERRNO | errno.ENOSYS
    # Checks of one argument: (number, argument, mask, value that is refused).
    checks = [
        (*table["fallocate"], _PUNCH_HOLE, 0),  # no hole punched: refused
        (*table["mmap"], _MAP_SHARED | _MAP_ANONYMOUS, _MAP_SHARED),  # a file's, shared
    ]
    # The syscall's number is loaded. Layout (classic BPF jumps only forward): one jump
    # per number to its check or its verdict, then allow; each check (load the argument,
    # mask it, compare: refused → EFBIG, else allow); EFBIG; ENOSYS.
    check_len = 4
    check_at = len(table["deny"]) + len(table["enosys"]) + len(checks) + 1
    efbig_at = check_at + check_len * len(checks)
    enosys_at = efbig_at + 1
    body: list[bytes] = []
    for nr in table["deny"]:
        body.append(_insn(_JEQ_K, nr, jt=efbig_at - len(body) - 1))
    for nr in table["enosys"]:
        body.append(_insn(_JEQ_K, nr, jt=enosys_at - len(body) - 1))
    for index, (nr, *_) in enumerate(checks):
        body.append(_insn(_JEQ_K, nr, jt=check_at + index * check_len - len(body) - 1))
    body.append(_insn(_RET_K, _RET_ALLOW))
    for _, arg, mask, refused in checks:
        body.append(_insn(_LD_W_ABS, _ARG0 + 8 * arg))  # the argument's low 32 bits
        body.append(_insn(_ALU_AND_K, mask))
        body.append(_insn(_JEQ_K, refused, jt=efbig_at - len(body) - 1))
        body.append(_insn(_RET_K, _RET_ALLOW))
    assert len(body) == efbig_at
    body.append(_insn(_RET_K, efbig))
    body.append(_insn(_RET_K, enosys))
    return b"".join(seccomp.native_only(audit_arch) + body)


def deny_growth() -> None:
    """No new name, no block past RLIMIT_FSIZE 0 (see the module contract), for this
    thread and its future children (irreversible)."""
    if landlock.abi_version() >= 1:
        ruleset = landlock.build_ruleset(landlock.Policy(_MAKE_ANY), [])
        try:
            landlock.restrict_self(ruleset)
        finally:
            os.close(ruleset)
    if not seccomp.available():
        seccomp.install(program())
