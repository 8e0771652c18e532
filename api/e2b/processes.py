"""envd's ``process.Process`` service over the runtime's processes (``runtime/processes.py``).

Contract: every ``Start`` (the SDK's foreground and background commands alike: envd makes
no difference, the SDK only stops waiting) starts a runtime process that outlives the
request, confined and limited as every execution is, from the sandbox's home. Its stream
is envd's: ``start`` (the pid), ``data`` (stdout/stderr base64), ``end``; keepalives
between. ``Connect`` follows a running process (its buffered output first), ``List``
names the sandbox's processes, ``SendSignal`` (SIGTERM, SIGKILL: the whole tree),
``SendInput`` and ``CloseStdin`` reach its stdin. A PTY is not supported. A process ends
with its sandbox (kill deletes the conversation: every process of it is killed; killing
an attached conversation only detaches it, and ``kill_all`` ends its commands), at its
``timeout`` (the SDK's, else the runtime's ``max_process_seconds``) and with the runtime.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import re
import shlex
from collections.abc import AsyncIterator
from typing import Any

from sandbox_workspace.contract.errors import ApiError, BadRequest
from sandbox_workspace.runtime.client import RuntimeClientError
from sandbox_workspace.runtime.schemas import ExecuteRequest

from ..runtime_client import RuntimeApiError
from . import connect
from .conversation import Sandbox
from .paths import to_relative

_SIGNALS = {"SIGNAL_SIGTERM": "SIGTERM", "SIGNAL_SIGKILL": "SIGKILL", 15: "SIGTERM", 9: "SIGKILL"}
UNARY = ("List", "SendSignal", "SendInput", "CloseStdin")
STREAMS = ("Start", "Connect")


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def command_of(process: dict) -> str:
    """The bash source for envd's ProcessConfig (``/bin/bash -l -c CMD`` is the SDK's)."""
    cmd = connect.field(process, "cmd", str, "")
    args = connect.field(process, "args", list, [])
    envs = connect.field(process, "envs", dict, {})
    if not all(isinstance(a, str) for a in args):
        raise BadRequest("'args' must be a list of strings")
    for name, value in envs.items():
        if not (_ENV_NAME.fullmatch(name) and isinstance(value, str)):
            raise BadRequest(
                f"'envs' maps variable names ([A-Za-z_][A-Za-z0-9_]*) to strings: "
                f"{name[:40]!r} does not"
            )
    if cmd in ("/bin/bash", "bash", "/bin/sh", "sh") and len(args) >= 2 and args[-2] == "-c":
        source = args[-1]
    else:
        source = shlex.join([cmd, *args])
    prefix = [f"export {k}={shlex.quote(v)}" for k, v in envs.items()]
    cwd = to_relative(process.get("cwd"))
    if cwd:
        prefix.append(f"cd {shlex.quote(cwd)}")
    return "\n".join([*prefix, source])


def pid_of(message: dict) -> int:
    selector = connect.field(message, "process", dict, {})
    if "pid" not in selector:
        raise BadRequest("select the process by pid (tags are not supported)")
    return connect.whole(selector, "pid", 0, 1, 2**32 - 1)


def _info(process: dict) -> dict[str, Any]:
    return {
        "pid": process["pid"],
        "config": {"cmd": "/bin/bash", "args": ["-l", "-c", process["code"]], "envs": {}},
    }


async def unary(method: str, sandbox: Sandbox, message: dict) -> dict:
    client = sandbox.client
    if method == "List":
        listed = await client.list_processes(sandbox.cid)
        return {"processes": [_info(p) for p in listed if p["running"]]}
    if method == "SendSignal":
        given = message.get("signal")
        signal = _SIGNALS.get(given) if isinstance(given, str | int) else None
        if signal is None:
            raise BadRequest(f"signal {str(given)[:40]!r} is not supported: SIGTERM or SIGKILL")
        await client.process_signal(sandbox.cid, pid_of(message), signal)
        return {}
    if method == "SendInput":
        data = connect.field(connect.field(message, "input", dict, {}), "stdin", str)
        if data is None:
            raise BadRequest("only stdin input is supported (no PTY)")
        await client.process_input(sandbox.cid, pid_of(message), base64.b64decode(data))
        return {}
    if method == "CloseStdin":
        await client.process_input(sandbox.cid, pid_of(message), b"", close=True)
        return {}
    raise NotImplementedError(method)


# How long a kill waits for the commands it killed to be reported ended.
KILL_WAIT_SECONDS = 10.0


async def kill_all(sandbox: Sandbox) -> None:
    """SIGKILL (each one's whole tree) every process still running in the sandbox, then
    wait (at most ``KILL_WAIT_SECONDS``) until the runtime reports each one ended: the
    kill answers once they are gone, so the sandbox attached again right after lists none
    of them (a signal is delivered at once; its end is seen when the process is reaped)."""
    killed = []
    for process in await sandbox.client.list_processes(sandbox.cid):
        if process["running"]:
            try:
                await sandbox.client.process_signal(sandbox.cid, process["pid"], "SIGKILL")
            except RuntimeApiError as e:
                if e.status != 404:  # 404: it ended meanwhile
                    raise
            else:
                killed.append(process["pid"])
    if killed:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(KILL_WAIT_SECONDS):
                await asyncio.gather(*(_ended(sandbox, pid) for pid in killed))


async def _ended(sandbox: Sandbox, pid: int) -> None:
    """Return when process ``pid``'s events reach their end (or it is not known: gone)."""
    with contextlib.suppress(RuntimeClientError):  # best effort: the kill was sent
        async for event in sandbox.client.process_events(sandbox.cid, pid):
            if event.get("type") == "end":
                return


def start_events(sandbox: Sandbox, message: dict, timeout: float | None) -> AsyncIterator[dict]:
    if message.get("pty"):
        raise _PtyUnsupported("a PTY is not supported")
    label = command_of(connect.field(message, "process", dict, {}))
    code = sandbox._at_home(ExecuteRequest(language="bash", code=label, timeout=1)).code
    stdin = bool(message.get("stdin", False))
    return sandbox.client.start_process(sandbox.cid, code, timeout=timeout, stdin=stdin)


class _PtyUnsupported(ApiError):
    status, code = 501, "not_supported"


def _end_event(event: dict) -> bytes:
    code = event["exit_code"]
    end: dict[str, Any] = {"exitCode": code, "exited": True}
    if code > 128:
        end["status"] = f"signal: {code - 128}"
    else:
        end["status"] = f"exit status {code}"
    if event.get("limit"):
        end["error"] = f"killed: {event['limit']}"
    return connect.envelope({"event": {"end": end}})


async def envd_stream(
    sandbox: Sandbox, runtime_events: AsyncIterator[dict]
) -> AsyncIterator[bytes]:
    """The runtime's process events as envd's ``ProcessEvent`` stream. At the process's
    end the after-write check (and the store's write-back) runs first, then the ``end``
    event and the stream's close go in one write: the SDK waits for the close anyway,
    and a write of the end alone cost a hop through the response (and, loaded, the
    event loop) before the check could start (bench e2b on the node: 20-380 ms)."""
    last = b""
    try:
        async for event in runtime_events:
            kind = event.get("type")
            if kind == "start":
                yield connect.envelope({"event": {"start": {"pid": event["pid"]}}})
            elif kind in ("stdout", "stderr"):
                yield connect.envelope({"event": {"data": {kind: event["data"]}}})
            elif kind == "end":
                last = _end_event(event)
                await sandbox.services.backend.conversation_written(sandbox.session, sandbox.cid)
                break  # nothing follows the end
    except ApiError as e:
        yield last + connect.end_stream(connect.code_for_status(e.status), e.message)
        return
    finally:
        close = getattr(runtime_events, "aclose", None)
        if close is not None:  # the runtime's answer, released at once
            await close()
    yield last + connect.end_stream()
