"""The runtime's side of the spawner (``runtime/spawner_main.py``): start code, track it.

Contract:
- ``await Spawner.start()`` starts the spawner process once (clean environment, its own
  session, dies with the runtime). It is started again if it ever dies.
- ``await spawn(cid, argv, env=…, cwd=…, read_write=…, fds=…)`` → ``Call`` once the code
  process runs (confined, fds placed at 0, 1, 2, 3…); raises ``SpawnFailed`` with the
  reason when it could not be started. The caller keeps ownership of its fds. ``guard``
  is called right before the request is sent (it may raise to refuse).
- With ``cpu_groups`` (``runtime/cpu_cgroup.py``) each conversation's code shares one
  CPU weight.
- ``limits`` (``runtime/limits.py``) are applied to the call's tree; ``Call.limit`` names
  the one it was killed for, if any, once ``exited`` is done; ``Call.frozen`` is the
  conversation's size when the call started over its quota (no write of it succeeds);
  ``mark_execution(call)`` starts a new execution's accounting on a long-lived call (a
  Python cell).
- ``Call.exited`` resolves to the exit status (128 + signal when killed);
  ``kill(call)`` kills the call's whole process tree; ``await stop(cid)`` returns once
  every process of the conversation is gone.
- ``busy`` is set while any call is starting or running, clear when none is: what
  watches running code waits on it instead of polling an idle runtime.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import os
import signal
import socket
import sys
from collections.abc import Callable
from dataclasses import dataclass, field

from .cpu_cgroup import CpuGroups
from .limits import Limits
from .pids import send_signal

log = logging.getLogger(__name__)

_MAX_MESSAGE = 1 << 20
# What the spawner inherits: enough to find the interpreter and our package.
_SPAWNER_ENV = ("PATH", "PYTHONPATH", "LANG", "LC_ALL", "TMPDIR")


class SpawnFailed(Exception):
    """The code process could not be started (the message says why). ``at_ceiling``: the
    process ceiling was full (code holds every process it may have), so the caller is
    told to wait or kill, not that the runtime is broken."""

    def __init__(self, message: str, *, at_ceiling: bool = False) -> None:
        super().__init__(message)
        self.at_ceiling = at_ceiling


@dataclass
class Call:
    id: int
    cid: str
    pid: int = 0
    start: int | None = None  # the code process's start time (``pids.start_time``)
    reaper: int = 0
    reaper_start: int | None = None
    watched: bool = False  # its reaper checks limits (and takes SIGUSR1)
    limit: str | None = None
    # The conversation's size when the call started over its quota: every write of its
    # tree fails (RLIMIT_FSIZE 0, ``runtime/reaper.py``). None: it was under.
    frozen: int | None = None
    exited: asyncio.Future = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


class Spawner:
    def __init__(self, config: dict, cpu_groups: CpuGroups | None = None) -> None:
        self.config = config
        self.cpu_groups = cpu_groups
        self._ids = itertools.count(1)
        self._sock: socket.socket | None = None
        self._proc: asyncio.subprocess.Process | None = None
        self._starting: dict[int, asyncio.Future] = {}
        self._calls: dict[int, Call] = {}
        self._stops: dict[int, asyncio.Future] = {}
        self._lock = asyncio.Lock()
        self.spawned = False  # whether any call was asked for (``configure`` only before)
        self.busy = asyncio.Event()

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    async def start(self) -> None:
        async with self._lock:
            if self._sock is not None:
                return
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            env = {k: os.environ[k] for k in _SPAWNER_ENV if k in os.environ}
            env["SBW_SPAWNER_CONFIG"] = json.dumps(self.config)
            try:
                argv = [sys.executable, "-m", "sandbox_workspace.runtime.spawner_main"]
                self._proc = await asyncio.create_subprocess_exec(
                    *argv,
                    str(theirs.fileno()),
                    str(os.getpid()),
                    env=env,
                    stdin=asyncio.subprocess.DEVNULL,
                    pass_fds=(theirs.fileno(),),
                    start_new_session=True,
                )
            finally:
                theirs.close()
            ours.setblocking(False)
            self._sock = ours
            asyncio.get_running_loop().add_reader(ours.fileno(), self._on_readable)

    async def spawn(
        self,
        cid: str,
        argv: list[str],
        *,
        env: dict[str, str],
        cwd: str,
        read_write: list[str],
        fds: list[int],
        guard: Callable[[], None] | None = None,
        limits: Limits | None = None,
        cpu_rlimit: bool = False,
        read_only: list[str] | None = None,
    ) -> Call:
        await self.start()
        if guard is not None:
            guard()  # synchronously right before the request leaves: nothing can slip in
        call = Call(id=next(self._ids), cid=cid, watched=limits is not None)
        self.spawned = True
        cpu_cgroup = self.cpu_groups.path(cid) if self.cpu_groups else None
        message = {
            "op": "spawn", "id": call.id, "cid": cid, "argv": argv, "env": env, "cwd": cwd,
            "read_write": read_write, "limits": limits.to_wire() if limits else None,
            "cpu_rlimit": cpu_rlimit, "cpu_cgroup": cpu_cgroup,
        }  # fmt: skip
        if read_only:  # a call of its own rules (runtime/readonly.py)
            message["read_only"] = read_only
        self._send(message, fds)
        # No answer can arrive before the next await: registering now is in time.
        started = asyncio.get_running_loop().create_future()
        self._starting[call.id] = started
        self._calls[call.id] = call
        self.busy.set()
        try:
            call.pid, call.start, call.reaper, call.reaper_start, call.frozen = await started
        except BaseException:
            self._starting.pop(call.id, None)
            self._forget(call.id)
            # Cancelled while starting: the spawner starts it anyway, so kill it right after.
            with contextlib.suppress(SpawnFailed):
                self._send({"op": "kill", "id": call.id})
            raise
        return call

    def configure(self, changes: dict) -> None:
        """Change the configuration of calls started from now on (a pooled runtime's
        claim: before any call). Messages keep their order: the next spawn sees it."""
        self.config.update(changes)
        if self._sock is not None:
            self._send({"op": "configure", "config": changes})

    def running(self) -> list[Call]:
        """Calls started and not yet exited."""
        return [c for c in self._calls.values() if c.reaper and not c.exited.done()]

    def mark_execution(self, call: Call) -> None:
        if call.watched and call.reaper and not call.exited.done():
            # By its start time too: a reaper reaped just now (its ``exited`` not read
            # yet) left its pid free, and SIGUSR1 ends a process that does not catch it.
            with contextlib.suppress(PermissionError):
                send_signal(call.reaper, call.reaper_start, signal.SIGUSR1)

    def kill(self, call: Call) -> None:
        if not call.exited.done():
            with contextlib.suppress(SpawnFailed):
                self._send({"op": "kill", "id": call.id})

    async def stop(self, cid: str) -> None:
        if self._sock is None:
            return
        request = next(self._ids)
        done = asyncio.get_running_loop().create_future()
        self._stops[request] = done
        try:
            self._send({"op": "stop", "id": request, "cid": cid})
        except SpawnFailed:
            self._stops.pop(request, None)
            return  # no spawner: no process of any conversation either
        await done

    def _send(self, message: dict, fds: list[int] = ()) -> None:
        if self._sock is None:
            raise SpawnFailed("the spawner is not running")
        data = json.dumps(message).encode()
        if len(data) > _MAX_MESSAGE:
            raise SpawnFailed("the command and its environment exceed 1 MiB")
        try:
            socket.send_fds(self._sock, [data], list(fds))
        except OSError as e:
            raise SpawnFailed(f"cannot reach the spawner: {e}") from e

    def _on_readable(self) -> None:
        assert self._sock is not None
        while True:
            try:
                data = self._sock.recv(_MAX_MESSAGE)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if not data:
                self._lost()
                return
            self._dispatch(json.loads(data))

    def _dispatch(self, message: dict) -> None:
        op, ident = message["op"], message["id"]
        if op == "started":
            started = (
                message["pid"],
                message.get("start"),
                message["reaper"],
                message.get("reaper_start"),
                message.get("frozen"),
            )
            _resolve(self._starting.pop(ident, None), started)
        elif op == "failed":
            future = self._starting.pop(ident, None)
            self._forget(ident)
            if future is not None and not future.done():
                ceiling = bool(message.get("ceiling"))
                future.set_exception(SpawnFailed(message["error"], at_ceiling=ceiling))
        elif op == "exited":
            call = self._forget(ident)
            if call is not None:
                call.limit = message.get("limit") or call.limit
                _resolve(call.exited, message["code"])
        elif op == "stopped":
            _resolve(self._stops.pop(ident, None), None)

    def _lost(self, *, closing: bool = False) -> None:
        """The spawner is gone (and every code process with it): fail what waits on it."""
        if self._sock is not None:
            asyncio.get_running_loop().remove_reader(self._sock.fileno())
            self._sock.close()
            self._sock = None
        if not closing:
            log.warning("the spawner exited; it is started again on the next execution")
        for future in self._starting.values():
            if not future.done():
                future.set_exception(SpawnFailed("the spawner exited"))
        for call in self._calls.values():
            _resolve(call.exited, 128 + 9)
        for future in self._stops.values():
            _resolve(future, None)
        self._starting, self._calls, self._stops = {}, {}, {}
        self.busy.clear()

    def _forget(self, ident: int) -> Call | None:
        call = self._calls.pop(ident, None)
        if not self._calls:
            self.busy.clear()
        return call

    async def aclose(self) -> None:
        """Stop the spawner; it kills every call before it exits."""
        proc = self._proc
        if self._sock is not None:
            self._lost(closing=True)
        if proc is not None and proc.returncode is None:
            try:
                await asyncio.wait_for(proc.wait(), 30.0)
            except TimeoutError:
                proc.kill()
                await proc.wait()


def _resolve(future: asyncio.Future | None, value: object) -> None:
    if future is not None and not future.done():
        future.set_result(value)
