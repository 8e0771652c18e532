"""The prctl(2) options the runtime's processes set, in one place (one libc handle).

Contract: ``call(option, arg2, arg3)`` is prctl with errno kept (``ctypes.get_errno``) and
returns its result; ``no_new_privs()`` raises ``OSError`` when refused — Landlock and the
seccomp filter must not go on without it. The constants are the kernel's
(``linux/prctl.h``).
"""

from __future__ import annotations

import ctypes
import os

PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_SET_SECCOMP = 22
PR_SET_CHILD_SUBREAPER = 36
PR_SET_NO_NEW_PRIVS = 38

_libc = ctypes.CDLL(None, use_errno=True)


def call(option: int, arg2: object = 0, arg3: object = 0) -> int:
    return _libc.prctl(option, arg2, arg3, 0, 0)


def no_new_privs() -> None:
    """This thread and everything it execs can never gain privileges (irreversible)."""
    if call(PR_SET_NO_NEW_PRIVS, 1) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl(PR_SET_NO_NEW_PRIVS): {os.strerror(err)}")
