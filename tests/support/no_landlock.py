"""Run a command under a seccomp filter that makes the Landlock syscalls fail (ENOSYS).

``python no_landlock.py CMD ARGS…`` — the honest way to test a runtime on a machine
"without Landlock": the real kernel answers the real syscalls with ENOSYS, as on an old
kernel or under a seccomp profile that does not allow them. Every other syscall passes.
"""

from __future__ import annotations

import ctypes
import errno
import os
import sys

_PR_SET_NO_NEW_PRIVS, _PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 38, 22, 2
_RET_ERRNO, _RET_ALLOW = 0x00050000, 0x7FFF0000
_LD_W_ABS, _JGE_K, _JGT_K, _RET_K = 0x20, 0x35, 0x25, 0x06
_FIRST, _LAST = 444, 446  # landlock_create_ruleset, _add_rule, _restrict_self


class _Filter(ctypes.Structure):
    _fields_ = [
        ("code", ctypes.c_uint16),
        ("jt", ctypes.c_uint8),
        ("jf", ctypes.c_uint8),
        ("k", ctypes.c_uint32),
    ]


class _Program(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_Filter))]


def deny_landlock() -> None:
    program = (_Filter * 5)(
        _Filter(_LD_W_ABS, 0, 0, 0),  # A = seccomp_data.nr
        _Filter(_JGE_K, 0, 2, _FIRST),  # nr < 444 → allow
        _Filter(_JGT_K, 1, 0, _LAST),  # nr > 446 → allow
        _Filter(_RET_K, 0, 0, _RET_ERRNO | errno.ENOSYS),
        _Filter(_RET_K, 0, 0, _RET_ALLOW),
    )
    libc = ctypes.CDLL(None, use_errno=True)
    prog = _Program(len(program), program)
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "PR_SET_NO_NEW_PRIVS")
    if libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "PR_SET_SECCOMP")


if __name__ == "__main__":
    deny_landlock()
    os.execvp(sys.argv[1], sys.argv[1:])
