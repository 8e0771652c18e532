"""Code execution for conversations: which interpreter, what environment, what limits.

Contract:
- Code runs with its working directory in the conversation's directory (created if
  missing), in an environment built from scratch: nothing of the runtime's own (its
  bearer token above all) is passed on.
- ``python`` uses the conversation's ``PythonKernel`` (state persists across calls);
  ``bash`` a fresh process. A non-zero exit code or an exception is data in the result.
- At most ``max_concurrent`` executions run at once; a call waits up to its own timeout
  for a slot, then gets 429. Running executions count as activity (``Activity.track``).
- Every code process is started by the spawner (``runtime/spawner.py``): confined with
  Landlock to its conversation directory and a private scratch directory (its ``HOME``,
  ``TMPDIR``, ``MPLCONFIGDIR``, outside the workspace), tracked with everything it starts.
  The scratch root is recorded in the runtime's state (``runtime/scratch.py``): one left
  by a runtime that was killed is removed by the next start or the deletion.
- POSIX shared memory and named semaphores of code (multiprocessing, joblib) live in
  that scratch directory (``runtime/shm.py``'s preload library), not in /dev/shm.
- With ``limits`` (``runtime/limits.py``) every execution is held to them; one that
  hits a limit ends with ``error.code`` naming it. With ``session_memory``, the memory of
  all code together is too (``watch_session_memory``).
- Nothing is spawned for a conversation being deleted (409 ``conversation_deleting``,
  checked right before the spawn request leaves); ``stop_conversation`` kills every
  process of a conversation and removes its scratch directory.
- Kernels idle longer than ``kernel_idle_seconds`` are reaped.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import time
from collections.abc import Callable

from sandbox_workspace.contract.errors import ApiError, ConversationDeleting

from . import pathsafe, readonly, shm
from .activity import Activity
from .bash import run_bash
from .bash_script import bash_command
from .confinement import Confinement
from .cpu_cgroup import CpuGroups
from .kernel import PythonKernel
from .limits import Limits, classify, usage_by_call
from .output import EventSink, OutputCollector, ResultCaps
from .pipes import CodePipes
from .schemas import ExecuteRequest, ExecutionError, ExecutionResult
from .spawner import Call, Spawner, SpawnFailed
from .workspace import Workspace

_INLINE_WALK_SECONDS = 0.002  # the session-memory walk runs on the loop while this quick
_THREAD_WALK_SECONDS = 10.0  # and after a slower one, in a thread for at least this long

_SAFE_PATH = "/usr/local/bin:/usr/bin:/bin"
_BLAS_THREADS = str(min(8, len(os.sched_getaffinity(0))))


class TooBusy(ApiError):
    """Every execution slot is taken."""

    status, code = 429, "too_many_executions"


class Executor:
    def __init__(
        self,
        workspace: Workspace,
        activity: Activity,
        *,
        output_cap: int,
        max_concurrent: int,
        kernel_idle_seconds: float,
        confinement: Confinement,
        run_as: tuple[int, int] | None = None,
        limits: Limits | None = None,
        session_memory: int | None = None,
        result_caps: ResultCaps = ResultCaps(),
        extra_env: dict[str, str] | None = None,
    ) -> None:
        self.result_caps = result_caps
        self.extra_env = dict(extra_env or {})  # code_env, the egress relay's proxy variables
        self.confinement = confinement
        self.limits = limits
        self.session_memory = session_memory
        self.workspace = workspace
        self.activity = activity
        self.output_cap = output_cap
        self.kernel_idle_seconds = kernel_idle_seconds
        self._slots = asyncio.Semaphore(max_concurrent)
        self._kernels: dict[str, PythonKernel] = {}
        # Conversations whose interpreter was reaped idle: their next call says the
        # state is gone (``kernel_restarted``), as nobody was told when it went.
        self._reaped: set[str] = set()
        # Bumped by stop_conversation: executions that started before it report the stop.
        self._generation: dict[str, int] = {}
        # Recorded in the state directory before any code runs: a runtime killed before its
        # aclose leaves it to the next runtime, or the deletion, to remove (runtime/scratch.py).
        self.scratch_root = workspace.scratch.create()
        self.shm_shim = shm.library()  # private POSIX shared memory for parallel code
        protected = [os.path.realpath(workspace.root.path), os.path.realpath(self.scratch_root)]
        self.cpu_groups = CpuGroups.create()  # a CPU share per conversation (root only)
        self.spawner = Spawner(
            confinement.spawner_config(protected=protected, run_as=run_as), self.cpu_groups
        )

    async def start(self) -> None:
        await self.spawner.start()

    async def watch_session_memory(self, interval: float = 0.25) -> None:
        """Keep the memory of all code together under ``session_memory``: past it, the
        execution holding the most is killed (memory_limit_exceeded). Overshoot: what
        code allocates in ``interval`` (RLIMIT_AS bounds each process meanwhile). With no
        call alive it sleeps until one starts: an idle runtime makes no wakeup for it."""
        if not self.session_memory:
            return
        threaded_until = 0.0
        while True:
            await self.spawner.busy.wait()  # a call started: it is measured ``interval`` on
            await asyncio.sleep(interval)
            spawner = self.spawner.pid
            if spawner is None or not self.spawner.running():
                continue  # nothing runs, nothing to kill: no /proc walk in a thread
            # A few processes (an idle interpreter) are walked in well under a millisecond:
            # on the loop, one wakeup, not four for the hand-off to a thread and back. After
            # a slower walk (a large tree: 500 processes take 10-20 ms) the walks go to a
            # thread for a while, so code that grows and shrinks its tree on purpose stalls
            # the loop once per _THREAD_WALK_SECONDS at most.
            if time.monotonic() < threaded_until:
                usage, spent = await asyncio.to_thread(_timed_usage, spawner)
            else:
                usage, spent = _timed_usage(spawner)
            if spent >= _INLINE_WALK_SECONDS:
                threaded_until = time.monotonic() + _THREAD_WALK_SECONDS
            if sum(usage.values()) <= self.session_memory:
                continue
            largest = max(usage, key=usage.__getitem__)
            for call in self.spawner.running():
                if call.reaper == largest:
                    call.limit = "session_memory"
                    self.spawner.kill(call)

    def scratch(self, cid: str) -> str:
        return os.path.join(self.scratch_root, cid)

    def environment(self, cid: str, cwd: str) -> dict[str, str]:
        """The whole environment executed code sees (nothing inherited by accident)."""
        # The runtime's own interpreter first: `python3` in code is the one with the
        # sandbox libraries, and its directory is readable under confinement (a shim
        # elsewhere on the runtime's PATH, e.g. pyenv's, may not be).
        interpreter_dir = os.path.dirname(sys.executable)
        path = os.pathsep.join([interpreter_dir, os.environ.get("PATH", _SAFE_PATH)])
        scratch = self.scratch(cid)
        return {
            # First: what the runtime sets itself wins (code_env naming PATH changes nothing).
            **self.extra_env,
            "PATH": path,
            "HOME": scratch,
            "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8",
            "PYTHONUNBUFFERED": "1",
            "PYTHONDONTWRITEBYTECODE": "1",
            "MPLBACKEND": "Agg",
            "MPLCONFIGDIR": scratch,
            "TMPDIR": scratch,
            "WORKSPACE_DIR": cwd,
            **shm.environment(self.shm_shim, scratch),
            # OpenBLAS reserves address space per thread, one per core by default: on a
            # node with many cores `import numpy` alone would pass RLIMIT_AS.
            "OPENBLAS_NUM_THREADS": _BLAS_THREADS,
        }

    def _guard(self, cid: str) -> Callable[[], None]:
        def check() -> None:
            if self.workspace.is_deleting(cid):
                raise ConversationDeleting(cid)

        return check

    async def execute(
        self, conversation_id: str, request: ExecuteRequest, on_event: EventSink | None = None
    ) -> ExecutionResult:
        self.confinement.check_can_execute()
        read_only = readonly.check(request, self.confinement)
        cid = self.workspace.ensure_layout(conversation_id)
        cwd = self.workspace.real_path(cid)
        collector = OutputCollector(self.output_cap, on_event, self.result_caps)
        started = time.perf_counter()
        try:
            async with asyncio.timeout(request.timeout):
                await self._slots.acquire()
        except TimeoutError:
            raise TooBusy("every execution slot is busy; retry shortly") from None
        generation = self._generation.get(cid, 0)
        try:
            with self.activity.track():
                os.makedirs(self.scratch(cid), mode=0o700, exist_ok=True)
                read_write = [cwd, self.scratch(cid)]
                restarted = False
                if request.language == "python":
                    kernel = self._kernel(cid, cwd, read_write)
                    error, restarted = await kernel.execute(
                        request.code, request.timeout, collector
                    )
                    exit_code = 0 if error is None else 1
                else:
                    ro = None
                    if read_only:  # seed 002's readonly nodes: see runtime/readonly.py
                        read_write, ro = readonly.rules(cwd, self.scratch(cid), read_only)
                    exit_code, error = await run_bash(
                        request.code,
                        cid=cid,
                        cwd=cwd,
                        env=self.environment(cid, cwd),
                        read_only=ro,
                        read_write=read_write,
                        timeout=request.timeout,
                        collector=collector,
                        spawner=self.spawner,
                        guard=self._guard(cid),
                        limits=self.limits,
                    )
        except SpawnFailed as e:
            collector.finish()
            exit_code = 126
            error = ExecutionError(name="SpawnError", value=f"the code could not start: {e}")
        finally:
            self._slots.release()
        error = classify(error, exit_code, self.limits)
        if self._generation.get(cid, 0) != generation:
            error = ExecutionError(
                name="ConversationStopped",
                value="the conversation's processes were stopped: it is being deleted",
            )
        return ExecutionResult(
            conversation_id=cid,
            language=request.language,
            stdout=collector.text("stdout"),
            stderr=collector.text("stderr"),
            exit_code=exit_code,
            error=error,
            results=[{"data": r} for r in collector.results],
            duration_ms=round((time.perf_counter() - started) * 1000, 3),
            truncated=collector.truncated,
            kernel_restarted=restarted,
        )

    async def bash_call(self, conversation_id: str, code: str, pipes: CodePipes) -> Call:
        """``bash -c CODE`` started as a bash execution starts (same confinement, limits,
        environment and CPU share) with ``pipes``, for a process that outlives the
        request (``runtime/processes.py``). Raises ``SpawnFailed`` if it could not start."""
        self.confinement.check_can_execute()
        cid = self.workspace.ensure_layout(conversation_id)
        cwd = self.workspace.real_path(cid)
        os.makedirs(self.scratch(cid), mode=0o700, exist_ok=True)
        try:
            with bash_command(code, pipes.child_fds) as (argv, fds):
                return await self.spawner.spawn(
                    cid, argv, env=self.environment(cid, cwd), cwd=cwd,
                    read_write=[cwd, self.scratch(cid)], fds=fds, guard=self._guard(cid),
                    limits=self.limits, cpu_rlimit=True,
                )  # fmt: skip
        finally:
            pipes.close_child_ends()

    def proxy_through(self, port: int, code_env: dict[str, str]) -> None:
        """A pooled runtime claimed for a session with an egress policy: its code gets
        network ``proxy_port`` at ``port`` and ``code_env``. Only before any code ran;
        the same again is a no-op, anything else ``ValueError``."""
        confinement = self.confinement
        same_env = all(self.extra_env.get(k) == v for k, v in code_env.items())
        if (confinement.network, confinement.connect_port, same_env) == ("proxy_port", port, True):
            return
        if self.spawner.spawned or self._kernels:
            raise ValueError("code ran already: its network cannot change")
        self.spawner.configure(confinement.proxy_through(port))
        self.extra_env.update(code_env)

    def _kernel(self, cid: str, cwd: str, read_write: list[str]) -> PythonKernel:
        kernel = self._kernels.get(cid)
        if kernel is None:
            kernel = PythonKernel(
                cid,
                cwd,
                self.environment(cid, cwd),
                self.spawner,
                read_write=read_write,
                guard=self._guard(cid),
                limits=self.limits,
                event_line_limit=self.result_caps.line_limit,
                state_lost=cid in self._reaped,
            )
            self._reaped.discard(cid)
            self._kernels[cid] = kernel
        return kernel

    async def restart(self, conversation_id: str) -> bool:
        """Kill the conversation's interpreter; the next call starts a fresh one."""
        cid = self.workspace.check_conversation_id(conversation_id)
        self._reaped.discard(cid)  # the caller asked: its answer says so
        kernel = self._kernels.pop(cid, None)
        if kernel is None:
            return False
        await kernel.kill()
        return True

    async def stop_conversation(self, conversation_id: str) -> None:
        """Afterwards no process of the conversation exists and its scratch dir is gone.

        Every call is killed with its whole tree (interpreter, running bash, daemons);
        executions in flight end with a ``ConversationStopped`` error.
        """
        cid = self.workspace.check_conversation_id(conversation_id)
        self._generation[cid] = self._generation.get(cid, 0) + 1
        self._reaped.discard(cid)  # a deleted conversation starts with no state to lose
        kernel = self._kernels.pop(cid, None)
        await self.spawner.stop(cid)
        if kernel is not None:
            await kernel.kill()
        fd = os.open(self.scratch_root, os.O_RDONLY | os.O_DIRECTORY)
        try:
            await asyncio.to_thread(pathsafe.remove_tree, fd, cid)
        finally:
            os.close(fd)
        if self.cpu_groups is not None:
            await asyncio.to_thread(self.cpu_groups.remove, cid)

    async def reap_idle(self) -> list[str]:
        now = time.monotonic()
        idle = [
            cid
            for cid, k in self._kernels.items()
            if not k.busy and now - k.last_used > self.kernel_idle_seconds
        ]
        for cid in idle:
            self._reaped.add(cid)
            await self._kernels.pop(cid).kill()
        return idle

    async def reap_forever(self, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            with contextlib.suppress(Exception):
                await self.reap_idle()

    async def aclose(self) -> None:
        self._kernels = {}
        await self.spawner.aclose()  # the spawner kills every call before it exits
        self.confinement.close()
        if self.cpu_groups is not None:
            self.cpu_groups.close()
        self.workspace.scratch.release(self.scratch_root)


def _timed_usage(spawner: int) -> tuple[dict[int, int], float]:
    """``usage_by_call(spawner)`` and the CPU seconds it took (its thread's: time preempted
    on a loaded machine is not the walk's cost)."""
    began = time.thread_time()
    return usage_by_call(spawner), time.thread_time() - began
