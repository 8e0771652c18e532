"""What confines executed code: decided once at start-up, applied by the spawner.

Contract: ``Confinement(settings…)`` probes the machine and holds the decision;
``report()`` says what is applied (``/v1/stats``); ``spawner_config(…)`` is the plain data
the spawner process needs to confine every code process it starts;
``check_can_execute()`` raises ``ConfinementUnavailable`` (503) when the mode is
``require`` and Landlock is missing or its ABI is below ``min_abi`` (``GUARANTEES`` says
what each ABI adds; the default, 6, asks for all of them).

What a code process gets, when Landlock is available (highest ABI, best effort):
- read-only (read, execute, list): the system (``/usr``, ``/lib*``, ``/bin``, ``/sbin``,
  ``/etc``, ``/opt``, ``/proc``, ``/sys``), the interpreter and its libraries
  (``sys.prefix``, ``sys.base_prefix``, ``sys.path``), this package's source, and a few
  device nodes (``/dev/null`` … read-write);
- read-write (every right, ``refer`` and ``truncate`` included): its conversation's
  directory and its private scratch directory — nothing else, so no other conversation,
  no runtime state (``{root}/.runtime``), not the runtime's temporary files;
- TCP bind/connect denied unless ``network == "allow"`` (ABI 4); and with the network
  denied, no internet socket at all — UDP, ICMP, raw, ``listen`` without ``bind`` —
  by a seccomp filter (``seccomp``; applied even where Landlock is missing);
- ``network == "proxy"`` (only in a network namespace whose one way out is the egress
  relay, ``runtime/egress.py``) and ``"proxy_port"`` (a sandbox pod whose NetworkPolicy
  leads only to the cluster's egress proxy): as denied, except IPv4 TCP sockets may be
  made and TCP connect is allowed to ``connect_port`` alone (the relay's, the proxy's);
- abstract unix sockets and signals scoped to its own domain (ABI 6): it cannot signal
  the runtime, the spawner or its reapers, nor talk to their abstract sockets.
A read-only candidate that contains the workspace root or the scratch base is dropped
(e.g. ``sys.path[0]`` being a parent of the root), so read access never reaches them.

Other limits, as the machine allows: a cgroup-v1 ``pids`` hierarchy with ``pids.max``
(a root runtime on a development machine), else ``RLIMIT_NPROC`` for a non-root runtime;
``PR_SET_DUMPABLE=0`` on the runtime (``harden_runtime_process``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
from pathlib import Path

from sandbox_workspace.contract.errors import ApiError

from . import landlock, prctl, seccomp
from .schemas import ConfinementReport

log = logging.getLogger(__name__)

_CGROUP_V1_PIDS = Path("/sys/fs/cgroup/pids")
_SYSTEM_READ_ONLY = (
    "/usr", "/lib", "/lib32", "/lib64", "/libx32", "/bin", "/sbin", "/etc", "/opt",
    "/proc", "/sys",
)  # fmt: skip
_DEV_READ_WRITE = ("/dev/null", "/dev/zero", "/dev/full", "/dev/tty")
_DEV_READ_ONLY = ("/dev/random", "/dev/urandom")
# What each Landlock ABI adds to the confinement of code (``confinement_min_abi``). No ABI
# mediates chmod, chown, utime, setxattr or stat: docs/security.md, residual risks.
GUARANTEES = (
    (1, "file access confined to the conversation and read-only system paths"),
    (2, "refer: no link or rename across directories"),
    (3, "truncate: no truncate(2) of other conversations' files"),
    (4, "TCP bind/connect denied"),
    (5, "ioctl on devices"),
    (6, "signals and abstract unix sockets scoped: no signal to the runtime or other "
        "conversations' interpreters"),
)  # fmt: skip
MIN_ABI = 6  # ``require``'s default: every guarantee above
# Networks where code reaches one TCP port only: the local relay's, the cluster proxy's.
_PROXIED = ("proxy", "proxy_port")


class ConfinementUnavailable(ApiError):
    """``confinement: require`` and Landlock cannot be applied."""

    status, code = 503, "confinement_unavailable"


def harden_runtime_process() -> None:
    """Make /proc/<runtime>/environ and friends unreadable to same-uid processes."""
    prctl.call(prctl.PR_SET_DUMPABLE, 0)


class Confinement:
    def __init__(
        self, *, max_processes: int, mode: str = "auto", network: str = "deny",
        min_abi: int = MIN_ABI, abi: int | None = None, connect_port: int | None = None,
    ) -> None:  # fmt: skip
        self.mode = mode
        self.connect_port = connect_port if network in _PROXIED else None
        self.min_abi = min_abi
        self.network = network
        self.max_processes = max_processes
        self.root = os.geteuid() == 0
        self.abi, self.unavailable = self._probe(abi) if mode != "none" else (0, "")
        self.cgroup = self._make_cgroup() if mode != "none" and self.root else None
        wants_filter = mode != "none" and network != "allow"
        self.no_filter = seccomp.available() if wants_filter else "not needed"
        if mode == "require" and 0 < self.abi < min_abi:
            log.warning(
                "EXECUTED CODE IS REFUSED: Landlock ABI %s is below the required %s (%s)",
                self.abi, min_abi, "; ".join(self.missing_below(min_abi)),
            )  # fmt: skip
        if mode != "none" and not self.abi:
            log.warning(
                "EXECUTED CODE IS NOT CONFINED: Landlock is unavailable (%s); mode %s %s",
                self.unavailable,
                mode,
                "refuses to run code" if mode == "require" else "runs code unconfined",
                extra={"confinement": self.report().model_dump()},
            )

    def proxy_through(self, port: int) -> dict:
        """From ``deny`` to ``proxy_port`` at ``port`` (a pooled runtime's claim, before
        any code ran): what changes in ``spawner_config``."""
        if self.network != "deny":
            raise ValueError(f"network {self.network!r} cannot become proxy_port")
        self.network, self.connect_port = "proxy_port", port
        return self._network_config()

    @staticmethod
    def _probe(given: int | None = None) -> tuple[int, str]:
        """The kernel's Landlock ABI (``given``: a stated one, for tests of the rules)."""
        abi = landlock.abi_version() if given is None else given
        return abi, ("" if abi else landlock.unavailable_reason() if given is None else "")

    @property
    def confined(self) -> bool:
        return self.abi > 0

    @property
    def denies_sockets(self) -> bool:
        return not self.no_filter

    def policy(self) -> landlock.Policy:
        net = 0 if self.network == "allow" else landlock.NET_BIND_TCP | landlock.NET_CONNECT_TCP
        scoped = landlock.SCOPE_ABSTRACT_UNIX_SOCKET | landlock.SCOPE_SIGNAL
        return landlock.Policy(landlock.fs_all(5), net, scoped).for_abi(self.abi)

    def features(self) -> list[str]:
        policy = self.policy()
        found = ["subreaper"]
        if self.confined:
            found.append("filesystem")
            found.append("read_only_entries")  # an execution's read_only (runtime/readonly.py)
            for name, bit in (
                ("refer", landlock.FS_REFER),
                ("truncate", landlock.FS_TRUNCATE),
                ("ioctl_dev", landlock.FS_IOCTL_DEV),
            ):
                if policy.fs & bit:
                    found.append(name)
            if policy.net:
                found.append("tcp")
            if policy.scoped & landlock.SCOPE_ABSTRACT_UNIX_SOCKET:
                found.append("scope_abstract_unix_socket")
            if policy.scoped & landlock.SCOPE_SIGNAL:
                found.append("scope_signal")
        if self.denies_sockets:  # the seccomp filter: internet, unix, vsock… all refused
            found.extend(("inet_sockets", "unix_sockets"))
        if self.cgroup:
            found.append("pids_cgroup")
        elif not self.root:
            found.append("rlimit_nproc")
        return found

    def report(self) -> ConfinementReport:
        if self.mode == "none":
            reason = "confinement is off (confinement: none)"
        elif not self.confined:
            reason = self.unavailable
        else:
            missing = [f"ABI {abi}: {what}" for abi, what in _LATER_FEATURES if self.abi < abi]
            if self.network != "allow" and self.abi < 4:
                missing.append("TCP cannot be denied")
            reason = ("kernel lacks " + "; ".join(missing)) if missing else ""
            if self.network != "allow" and not self.denies_sockets:
                unfiltered = f"UDP and unix sockets not denied: {self.no_filter}"
                reason = "; ".join(filter(None, [reason, unfiltered]))
        if self.network == "allow":
            network = "allowed"
        elif self.network in _PROXIED:
            network = "proxy" if self.confined and self.abi >= 4 else "unrestricted"
        else:
            network = "denied" if self.confined and self.abi >= 4 else "unrestricted"
        return ConfinementReport(
            mode=self.mode,
            confined=self.confined,
            landlock_abi=self.abi,
            network=network,
            features=self.features(),
            reason=reason,
        )

    def describe(self) -> list[str]:
        """One line per applied measure, for the start-up log."""
        return self.features()

    def missing_below(self, abi: int) -> list[str]:
        """What the running ABI lacks of ``abi``'s guarantees (``GUARANTEES``)."""
        return [f"ABI {n}: {what}" for n, what in GUARANTEES if self.abi < n <= abi]

    def check_can_execute(self) -> None:
        if self.mode == "require" and not self.confined:
            raise ConfinementUnavailable(
                f"this sandbox refuses to run code unconfined (confinement: require) and "
                f"Landlock is unavailable: {self.unavailable}. Run on Linux >= 5.13 with "
                "Landlock enabled (lsm=…,landlock), allow the landlock_* syscalls in the "
                "seccomp profile, or set confinement to auto"
            )
        if self.mode == "require" and self.abi < self.min_abi:
            raise ConfinementUnavailable(
                f"this sandbox refuses to run code (confinement: require) with Landlock ABI "
                f"{self.abi}, below the required {self.min_abi}: the kernel lacks "
                f"{'; '.join(self.missing_below(self.min_abi))}. Run on a newer kernel, or "
                "lower the minimum ABI (SANDBOX_RUNTIME_CONFINEMENT_MIN_ABI; chart "
                "sandbox.confinementMinAbi) accepting what it loses"
            )

    def read_only_rules(self, *, protected: list[str]) -> list[tuple[str, int]]:
        """Read-only paths: system, interpreter, package — minus any parent of ``protected``."""
        import sandbox_workspace
        import sandbox_workspace.runtime

        # Only the two package directories the interpreter needs (kernel_main), not the
        # source tree around them: a development data directory may live inside it.
        packages = [
            os.path.dirname(m.__file__ or "")
            for m in (sandbox_workspace, sandbox_workspace.runtime)
        ]
        candidates = [
            *_SYSTEM_READ_ONLY,
            sys.prefix,
            sys.base_prefix,
            sys.exec_prefix,
            str(Path(sys.executable).resolve().parent),
            *packages,
            # Not the runtime's working directory (``python -m`` puts it first): code needs
            # none of it, and it may be a home directory.
            *(p for p in sys.path if p and os.path.isdir(p) and p != os.getcwd()),
        ]
        rules: list[tuple[str, int]] = []
        seen = set()
        for candidate in candidates:
            path = os.path.realpath(candidate)
            if path in seen or any(_contains(path, p) or _contains(p, path) for p in protected):
                continue
            seen.add(path)
            rules.append((path, landlock.FS_READ))
        read_write_dev = landlock.FS_READ_FILE | landlock.FS_WRITE_FILE | landlock.FS_TRUNCATE
        rules += [(p, read_write_dev | landlock.FS_IOCTL_DEV) for p in _DEV_READ_WRITE]
        rules += [(p, landlock.FS_READ_FILE) for p in _DEV_READ_ONLY]
        return rules

    def spawner_config(self, *, protected: list[str], run_as: tuple[int, int] | None) -> dict:
        """Everything the spawner needs, as JSON-able data."""
        policy = self.policy()
        return {
            "landlock": self.confined,
            "policy": [policy.fs, policy.net, policy.scoped],
            "read_only": self.read_only_rules(protected=protected) if self.confined else [],
            "read_write": landlock.fs_all(self.abi) if self.confined else 0,
            "cgroup": str(self.cgroup) if self.cgroup else None,
            "nproc": self.max_processes if not self.root else None,
            "deny_sockets": self.denies_sockets,
            **self._network_config(),
            "run_as": list(run_as) if run_as else None,
        }

    def _network_config(self) -> dict:
        """The spawner's network keys: the one port code may connect to, IPv4 sockets."""
        return {
            "connect_ports": [self.connect_port] if self.connect_port else [],
            "inet": self.network in _PROXIED,
        }

    def _make_cgroup(self) -> Path | None:
        if not os.access(_CGROUP_V1_PIDS, os.W_OK):
            return None
        parent = _CGROUP_V1_PIDS / "sandbox-workspace"
        path = parent / f"runtime-{os.getpid()}"
        _remove_stale(parent)
        try:
            path.mkdir(parents=True, exist_ok=True)
            (path / "pids.max").write_text(str(self.max_processes))
        except OSError:
            return None
        return path

    def close(self) -> None:
        if self.cgroup is None:
            return
        # Killed processes leave the cgroup a moment after their parent was reaped.
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:
            try:
                self.cgroup.rmdir()
                return
            except OSError:
                time.sleep(0.01)


_LATER_FEATURES = (
    (2, "refer (cross-directory links and renames are refused)"),
    (3, "truncate"),
    (5, "ioctl on devices"),
    (6, "signal and abstract unix socket scoping"),
)


def _contains(parent: str, child: str) -> bool:
    """Whether ``child`` is ``parent`` or lies beneath it (both real paths)."""
    return child == parent or child.startswith(parent.rstrip("/") + "/")


def _remove_stale(parent: Path) -> None:
    """cgroups of runtimes that died without cleaning up (their pid is gone, no members)."""
    if not parent.is_dir():
        return
    for child in parent.glob("runtime-*"):
        pid = child.name.removeprefix("runtime-")
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            with contextlib.suppress(OSError):
                child.rmdir()
