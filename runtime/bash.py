"""``language: bash``: a fresh process per call, in the conversation's directory.

Contract: the script runs as ``bash --noprofile --norc -c CODE`` (a large one from a file:
``bash_script``), started through the
spawner (confined, in its own session, stdin ``/dev/null``, a scrubbed environment);
stdout and stderr are read concurrently into the collector as they come. At the deadline
the call's whole process tree is killed — whatever it started, daemons included. When the
script ends, whatever it left running (``sleep 1000 &``, ``setsid … &``) is killed too,
so one call cannot leave work behind. The exit code is data: 124 on timeout, like
``timeout(1)``. A call that starts with its conversation over its quota can write no file
(``runtime/reaper.py``); a tool killed for trying says so: ``conversation_quota_exceeded``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from .bash_script import bash_command
from .limits import Limits, frozen_outcome, limit_error
from .output import OutputCollector
from .pipes import CodePipes
from .schemas import ExecutionError
from .spawner import Spawner

_READ_CHUNK = 64 * 1024
_DRAIN_GRACE = 2.0
TIMEOUT_EXIT_CODE = 124


async def run_bash(
    code: str,
    *,
    cid: str,
    cwd: str,
    env: dict[str, str],
    read_write: list[str],
    timeout: float,
    collector: OutputCollector,
    spawner: Spawner,
    guard: Callable[[], None] | None = None,
    limits: Limits | None = None,
    read_only: list[str] | None = None,
) -> tuple[int, ExecutionError | None]:
    pipes = CodePipes()
    try:
        try:
            with bash_command(code, pipes.child_fds) as (argv, fds):
                call = await spawner.spawn(
                    cid, argv, env=env, cwd=cwd, read_write=read_write, fds=fds, guard=guard,
                    limits=limits, cpu_rlimit=True, read_only=read_only,
                )  # fmt: skip
        finally:
            pipes.close_child_ends()
        readers = [
            asyncio.create_task(_pump("stdout", await pipes.reader(pipes.stdout), collector)),
            asyncio.create_task(_pump("stderr", await pipes.reader(pipes.stderr), collector)),
        ]
        error = None
        try:
            async with asyncio.timeout(timeout):
                exit_code = await asyncio.shield(call.exited)
        except BaseException as e:  # timeout, or the request was cancelled: kill the tree
            spawner.kill(call)
            exit_code = await asyncio.shield(call.exited)
            if not isinstance(e, TimeoutError):
                raise
            error = ExecutionError(name="TimeoutError", value=f"execution exceeded {timeout:g}s")
        if call.limit:  # the reaper killed the tree past a limit
            error = limit_error(call.limit, limits, state_lost=False)
        # The tree is gone, so the pipes are at EOF; the grace only bounds a slow drain.
        _, pending = await asyncio.wait(readers, timeout=_DRAIN_GRACE)
        for task in pending:
            task.cancel()
    finally:
        pipes.close()
    collector.finish()
    code = TIMEOUT_EXIT_CODE if error else exit_code
    return code, frozen_outcome(error, exit_code, limits, call.frozen)


async def _pump(name: str, reader: asyncio.StreamReader, collector: OutputCollector) -> None:
    while chunk := await reader.read(_READ_CHUNK):
        collector.feed(name, chunk)
