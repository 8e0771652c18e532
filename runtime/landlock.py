"""A minimal binding of the Linux Landlock LSM (ctypes, no dependency).

Why our own: the one binding on PyPI (``landlock`` 1.0.0.dev5) is an alpha that knows
neither network rules (ABI 4) nor scopes (ABI 6). This module covers the UAPI up to ABI 7
(``include/uapi/linux/landlock.h``), best effort: ``abi_version()`` asks the kernel what
it offers, and ``Policy.for_abi`` drops every right or scope that ABI does not know, as
the kernel documentation recommends, so one policy works on every kernel that has
Landlock at all.

Contract:
- ``abi_version()`` → 0 when Landlock is missing (old kernel, disabled LSM, a seccomp
  profile that blocks the syscalls), else the highest ABI; it never raises.
- ``Policy`` says what is handled (denied unless a rule allows it); ``build_ruleset``
  turns it plus path rules into a ruleset fd; ``restrict_self(fd)`` sets no_new_privs and
  enforces it on the calling thread — meant for a freshly forked child right before exec.
  Errors raise ``LandlockError`` carrying the errno and what was being done.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import stat
from collections.abc import Iterable
from dataclasses import dataclass, replace

from . import prctl

# Syscall numbers: the same on every architecture with the generic table (x86_64, arm64).
_SYS_CREATE_RULESET, _SYS_ADD_RULE, _SYS_RESTRICT_SELF = 444, 445, 446
_CREATE_RULESET_VERSION = 1 << 0
_RULE_PATH_BENEATH, _RULE_NET_PORT = 1, 2

# Filesystem rights, with the ABI that introduced them.
FS_EXECUTE = 1 << 0
FS_WRITE_FILE = 1 << 1
FS_READ_FILE = 1 << 2
FS_READ_DIR = 1 << 3
FS_REMOVE_DIR = 1 << 4
FS_REMOVE_FILE = 1 << 5
FS_MAKE_CHAR = 1 << 6
FS_MAKE_DIR = 1 << 7
FS_MAKE_REG = 1 << 8
FS_MAKE_SOCK = 1 << 9
FS_MAKE_FIFO = 1 << 10
FS_MAKE_BLOCK = 1 << 11
FS_MAKE_SYM = 1 << 12
FS_REFER = 1 << 13  # ABI 2
FS_TRUNCATE = 1 << 14  # ABI 3
FS_IOCTL_DEV = 1 << 15  # ABI 5
NET_BIND_TCP = 1 << 0  # ABI 4
NET_CONNECT_TCP = 1 << 1  # ABI 4
SCOPE_ABSTRACT_UNIX_SOCKET = 1 << 0  # ABI 6
SCOPE_SIGNAL = 1 << 1  # ABI 6

_FS_ABI1 = (1 << 13) - 1
FS_ALL_BY_ABI = {
    1: _FS_ABI1,
    2: _FS_ABI1 | FS_REFER,
    3: _FS_ABI1 | FS_REFER | FS_TRUNCATE,
    4: _FS_ABI1 | FS_REFER | FS_TRUNCATE,
    5: _FS_ABI1 | FS_REFER | FS_TRUNCATE | FS_IOCTL_DEV,
}
FS_READ = FS_EXECUTE | FS_READ_FILE | FS_READ_DIR
# Rights that make sense on a file (not a directory); others on a file rule are EINVAL.
FS_FILE_RIGHTS = FS_EXECUTE | FS_WRITE_FILE | FS_READ_FILE | FS_TRUNCATE | FS_IOCTL_DEV


def fs_all(abi: int) -> int:
    return FS_ALL_BY_ABI[min(max(abi, 1), 5)]


class LandlockError(OSError):
    """A Landlock syscall failed (errno and the step are in the message)."""


class _RulesetAttr(ctypes.Structure):
    _fields_ = [
        ("handled_access_fs", ctypes.c_uint64),
        ("handled_access_net", ctypes.c_uint64),
        ("scoped", ctypes.c_uint64),
    ]


class _NetPortAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("port", ctypes.c_uint64)]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def _syscall(number: int, *args: object, what: str) -> int:
    result = _libc.syscall(ctypes.c_long(number), *args)
    if result < 0:
        err = ctypes.get_errno()
        raise LandlockError(err, f"{what}: {os.strerror(err)}")
    return result


def abi_version() -> int:
    """The kernel's Landlock ABI, 0 when unavailable for any reason."""
    if platform.system() != "Linux":
        return 0
    try:
        return _syscall(
            _SYS_CREATE_RULESET,
            None,
            ctypes.c_size_t(0),
            ctypes.c_uint32(_CREATE_RULESET_VERSION),
            what="landlock_create_ruleset(VERSION)",
        )
    except LandlockError:
        return 0


def unavailable_reason() -> str:
    """Why ``abi_version()`` is 0, in words an operator can act on."""
    try:
        _syscall(
            _SYS_CREATE_RULESET,
            None,
            ctypes.c_size_t(0),
            ctypes.c_uint32(_CREATE_RULESET_VERSION),
            what="landlock_create_ruleset",
        )
    except LandlockError as e:
        if e.errno == errno.EOPNOTSUPP:
            return (
                "Landlock is built into this kernel but disabled: add 'landlock' to the "
                "kernel's lsm= boot parameter"
            )
        if e.errno in (errno.ENOSYS, errno.EPERM):
            return (
                f"{e.strerror}: the kernel lacks Landlock (Linux >= 5.13 with "
                "CONFIG_SECURITY_LANDLOCK) or a seccomp profile blocks its syscalls"
            )
        return str(e.strerror)
    return ""


@dataclass(frozen=True)
class Policy:
    """What a ruleset handles: everything here is denied unless a rule allows it."""

    fs: int
    net: int = 0
    scoped: int = 0

    def for_abi(self, abi: int) -> Policy:
        """The same policy without what ``abi`` does not know (best-effort downgrade)."""
        if abi < 1:
            return Policy(0)
        net = self.net if abi >= 4 else 0
        scoped = self.scoped if abi >= 6 else 0
        return replace(self, fs=self.fs & fs_all(abi), net=net, scoped=scoped)


def build_ruleset(
    policy: Policy,
    rules: Iterable[tuple[str, int]],
    no_follow: Iterable[tuple[str, int]] = (),
    connect_ports: Iterable[int] = (),
) -> int:
    """A ruleset fd enforcing ``policy`` with ``(path, allowed rights)`` exceptions.

    A path that does not exist is skipped (a system without /lib64 is fine); a right the
    policy does not handle is dropped from the rule; on a file, only file rights count.
    ``no_follow`` rules are paths that code may have made (a conversation's entries):
    a symlink there is skipped, never followed — else it would grant its target.
    ``connect_ports``: TCP ports code may connect to although the policy handles connect
    (the egress relay's, in a sandbox whose network is the proxy).
    """
    attr = _RulesetAttr(policy.fs, policy.net, policy.scoped)
    # Kernels before ABI 4 / 6 know a shorter struct: pass only what they know.
    size = 8 if not (policy.net or policy.scoped) else (16 if not policy.scoped else 24)
    fd = _syscall(
        _SYS_CREATE_RULESET,
        ctypes.byref(attr),
        ctypes.c_size_t(size),
        ctypes.c_uint32(0),
        what="landlock_create_ruleset",
    )
    try:
        for path, allowed in rules:
            add_path_rule(fd, path, allowed & policy.fs)
        for path, allowed in no_follow:
            add_path_rule(fd, path, allowed & policy.fs, follow=False)
        if policy.net & NET_CONNECT_TCP:
            for port in connect_ports:
                add_port_rule(fd, port, NET_CONNECT_TCP)
    except BaseException:
        os.close(fd)
        raise
    return fd


def add_path_rule(ruleset_fd: int, path: str, allowed: int, *, follow: bool = True) -> None:
    flags = os.O_PATH | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    try:
        target = os.open(path, flags)
    except FileNotFoundError:
        return
    try:
        mode = os.fstat(target).st_mode
        if not (stat.S_ISDIR(mode) or stat.S_ISREG(mode)) and not follow:
            return  # a symlink (or fifo, socket…) made by code: no rule through it
        if not stat.S_ISDIR(mode):
            allowed &= FS_FILE_RIGHTS
        if not allowed:
            return
        rule = _PathBeneathAttr(allowed, target)
        _syscall(
            _SYS_ADD_RULE,
            ctypes.c_int(ruleset_fd),
            ctypes.c_int(_RULE_PATH_BENEATH),
            ctypes.byref(rule),
            ctypes.c_uint32(0),
            what=f"landlock_add_rule({path})",
        )
    finally:
        os.close(target)


def add_port_rule(ruleset_fd: int, port: int, allowed: int) -> None:
    rule = _NetPortAttr(allowed, port)
    _syscall(
        _SYS_ADD_RULE,
        ctypes.c_int(ruleset_fd),
        ctypes.c_int(_RULE_NET_PORT),
        ctypes.byref(rule),
        ctypes.c_uint32(0),
        what=f"landlock_add_rule(tcp port {port})",
    )


def restrict_self(ruleset_fd: int) -> None:
    """Enforce the ruleset on this thread and every process it will start (irreversible)."""
    try:
        prctl.no_new_privs()
    except OSError as e:
        raise LandlockError(e.errno, e.strerror) from e
    _syscall(
        _SYS_RESTRICT_SELF,
        ctypes.c_int(ruleset_fd),
        ctypes.c_uint32(0),
        what="landlock_restrict_self",
    )
