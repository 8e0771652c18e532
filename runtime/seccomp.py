"""A seccomp filter for executed code when its network is denied: no sockets of its own.

Landlock (``landlock``) denies TCP bind/connect, and nothing else of the network: a code
process could still send UDP (a DNS query carries data out), open ICMP or raw sockets,
SCTP or MPTCP, ``listen()`` on a TCP socket it never bound, reach the host through
``AF_VSOCK``, or connect to a named unix socket by its path — Landlock has no right for
that before ABI 9, and a daemon's socket (``/run/docker.sock``, containerd's, D-Bus) is
the whole machine where the runtime runs as root (local development). With the network
denied there is nothing legitimate to do with a socket of any of those families, so this
filter lets ``socket()`` create only netlink sockets (``getifaddrs``, which glibc's
``getaddrinfo`` uses): every other family fails with ``EACCES``, the error Landlock gives
for a denied connect. ``socketpair()`` — an unnamed pair, IPC inside the code's own
process tree (asyncio's self-pipe, ``multiprocessing.Pipe``) — is untouched. What stops
working: ``multiprocessing`` managers and the ``forkserver`` start method (they listen on
a unix socket); ``fork`` and ``spawn`` pools do not need one.

Ways around such a filter, closed too:
- ``io_uring`` can create sockets without the ``socket`` syscall (IORING_OP_SOCKET):
  ``io_uring_setup``/``enter``/``register`` fail with ``EACCES``.
- The other ABIs of the same kernel: on x86_64, ``int 0x80`` reaches the i386 table
  (``socketcall``, its own ``socket`` number) and x32 numbers carry bit 30. Every syscall
  of an architecture other than the native one, and every x32 number, fails with
  ``ENOSYS``: no code of ours runs 32-bit, so nothing legitimate is lost.

Contract: ``available()`` says whether the kernel takes filters; ``deny_sockets()``
installs the filter on the calling thread and every process it will start (irreversible;
sets ``no_new_privs``, which Landlock sets anyway). Supported: x86_64 and aarch64; on
another architecture ``available()`` is False and nothing is installed.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import struct

from . import prctl

_SECCOMP_MODE_FILTER = 2

# BPF (classic) instructions used here.
_LD_W_ABS = 0x20  # BPF_LD | BPF_W | BPF_ABS
_JEQ_K = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
_JGE_K = 0x35  # BPF_JMP | BPF_JGE | BPF_K
_RET_K = 0x06  # BPF_RET | BPF_K

_RET_ALLOW = 0x7FFF0000
_RET_ERRNO = 0x00050000  # | errno

# struct seccomp_data: int nr; __u32 arch; __u64 ip; __u64 args[6]
_NR, _ARCH, _ARG0 = 0, 4, 16  # args[0]'s low 32 bits (little endian)

_AF_INET = 2  # with ``inet``: the sandbox's network is the egress relay only
_AF_NETLINK = 16  # the one family code may otherwise create
_SOCK_STREAM, _SOCK_TYPE_MASK = 1, 0xF  # SOCK_NONBLOCK/SOCK_CLOEXEC sit above the mask
_IPPROTO_TCP = 6
_X32_BIT = 0x40000000

# arch → (AUDIT_ARCH value, socket's number, listen's number); io_uring's numbers are the
# same everywhere.
_ARCHES = {
    "x86_64": (0xC000003E, 41, 50),
    "aarch64": (0xC00000B7, 198, 201),
}
_IO_URING = (425, 426, 427)  # setup, enter, register
_ARG1, _ARG2 = _ARG0 + 8, _ARG0 + 16
_ALU_AND_K = 0x54  # BPF_ALU | BPF_AND | BPF_K


def _insn(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("HBBI", code, jt, jf, k)


def program(machine: str | None = None, *, inet: bool = False) -> bytes:
    """The filter for ``machine`` (default: this one), as ``struct sock_filter``s.

    ``inet``: code in a network namespace whose one way out is the egress relay may also
    make IPv4 TCP sockets (``socket(AF_INET, SOCK_STREAM, 0 or IPPROTO_TCP)``; Landlock
    limits their connect to the relay's port and denies bind) — still no UDP, ICMP, raw,
    IPv6 or unix socket — and may not ``listen`` at all (listen binds an unbound socket
    by itself, which Landlock does not see)."""
    audit_arch, nr_socket, nr_listen = _ARCHES[machine or platform.machine()]
    deny = _RET_ERRNO | errno.EACCES
    head = native_only(audit_arch)
    if not inet:
        body = [
            _insn(_JEQ_K, _IO_URING[0], jt=4),
            _insn(_JEQ_K, _IO_URING[1], jt=3),
            _insn(_JEQ_K, _IO_URING[2], jt=2),
            _insn(_JEQ_K, nr_socket, jt=2),
            _insn(_RET_K, _RET_ALLOW),
            _insn(_RET_K, deny),  # io_uring
            _insn(_LD_W_ABS, _ARG0),  # socket(domain, …)
            _insn(_JEQ_K, _AF_NETLINK, jt=1),
            _insn(_RET_K, deny),
            _insn(_RET_K, _RET_ALLOW),
        ]
        return b"".join(head + body)
    body = [
        _insn(_JEQ_K, _IO_URING[0], jt=5),  # → deny
        _insn(_JEQ_K, _IO_URING[1], jt=4),
        _insn(_JEQ_K, _IO_URING[2], jt=3),
        _insn(_JEQ_K, nr_listen, jt=2),
        _insn(_JEQ_K, nr_socket, jt=2),  # → socket checks
        _insn(_RET_K, _RET_ALLOW),
        _insn(_RET_K, deny),  # io_uring, listen
        _insn(_LD_W_ABS, _ARG0),  # socket(domain, type, protocol)
        _insn(_JEQ_K, _AF_NETLINK, jt=8),  # → allow
        _insn(_JEQ_K, _AF_INET, jf=6),  # other families → deny
        _insn(_LD_W_ABS, _ARG1),
        _insn(_ALU_AND_K, _SOCK_TYPE_MASK),
        _insn(_JEQ_K, _SOCK_STREAM, jf=3),  # datagram, raw… → deny
        _insn(_LD_W_ABS, _ARG2),
        _insn(_JEQ_K, 0, jt=2),  # → allow
        _insn(_JEQ_K, _IPPROTO_TCP, jt=1),  # → allow (MPTCP, SCTP… → deny)
        _insn(_RET_K, deny),
        _insn(_RET_K, _RET_ALLOW),
    ]
    return b"".join(head + body)


def native_only(audit_arch: int) -> list[bytes]:
    """A filter's first instructions: a syscall of another ABI (``int 0x80``, x32) fails
    with ENOSYS; then the syscall's number is loaded. Each jump is counted in
    instructions from the next one."""
    return [
        _insn(_LD_W_ABS, _ARCH),
        _insn(_JEQ_K, audit_arch, jt=1),  # native: go on; foreign: ENOSYS
        _insn(_RET_K, _RET_ERRNO | errno.ENOSYS),
        _insn(_LD_W_ABS, _NR),
        _insn(_JGE_K, _X32_BIT, jf=1),  # x32 numbers: ENOSYS
        _insn(_RET_K, _RET_ERRNO | errno.ENOSYS),
    ]


def available() -> str:
    """Empty when the filter can be installed here; else why not."""
    if platform.machine() not in _ARCHES:
        return f"seccomp filter not built for {platform.machine()}"
    try:
        with open("/proc/self/status") as f:
            if not any(line.startswith("Seccomp:") for line in f):
                return "the kernel has no seccomp (no Seccomp: in /proc/self/status)"
    except OSError as e:
        return f"cannot read /proc/self/status: {e}"
    return ""


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]


def deny_sockets(*, inet: bool = False) -> None:
    """Install the filter on this thread and its future children (irreversible)."""
    install(program(inet=inet))


def install(prog: bytes) -> None:
    """Install the filter ``prog`` on this thread and its future children (irreversible;
    filters stack: every one installed applies)."""
    fprog = _SockFprog(len(prog) // 8, prog)
    prctl.no_new_privs()
    if prctl.call(prctl.PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(fprog)) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl(PR_SET_SECCOMP): {os.strerror(err)}")
