"""``language: bash``: a fresh process per call, in the conversation's directory.

Contract: the script runs as ``bash --noprofile --norc -c CODE`` in its own session with
stdin closed and a scrubbed environment; stdout and stderr are read concurrently into the
collector as they come. At the deadline the whole process group is killed. When the
script ends, whatever it left running in its group (``sleep 1000 &``) is killed too, so
one call cannot leave work behind. The exit code is data: 124 on timeout, like
``timeout(1)``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal

from .confinement import Confinement
from .identity import identity
from .output import OutputCollector
from .schemas import ExecutionError

_READ_CHUNK = 64 * 1024
_DRAIN_GRACE = 2.0
TIMEOUT_EXIT_CODE = 124


async def run_bash(
    code: str,
    *,
    cwd: str,
    env: dict[str, str],
    timeout: float,
    collector: OutputCollector,
    confinement: Confinement,
    user: int | None = None,
    group: int | None = None,
) -> tuple[int, ExecutionError | None]:
    proc = await asyncio.create_subprocess_exec(
        *confinement.wrap(["bash", "--noprofile", "--norc", "-c", code]),
        cwd=cwd,
        env=env,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
        **identity(user, group),
    )
    confinement.after_spawn(proc.pid)
    assert proc.stdout is not None and proc.stderr is not None
    readers = [
        asyncio.create_task(_pump("stdout", proc.stdout, collector)),
        asyncio.create_task(_pump("stderr", proc.stderr, collector)),
    ]
    error = None
    try:
        async with asyncio.timeout(timeout):
            await proc.wait()
    except TimeoutError:
        error = ExecutionError(name="TimeoutError", value=f"execution exceeded {timeout:g}s")
    finally:
        _kill_group(proc.pid)
        await proc.wait()
    # Descendants that escaped the group could hold the pipes open: bound the wait.
    _, pending = await asyncio.wait(readers, timeout=_DRAIN_GRACE)
    for task in pending:
        task.cancel()
    collector.finish()
    exit_code = TIMEOUT_EXIT_CODE if error else proc.returncode
    assert exit_code is not None
    return exit_code, error


async def _pump(name: str, reader: asyncio.StreamReader, collector: OutputCollector) -> None:
    while chunk := await reader.read(_READ_CHUNK):
        collector.feed(name, chunk)


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)
