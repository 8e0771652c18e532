"""Code execution for conversations: which interpreter, what environment, what limits.

Contract:
- Code runs with its working directory in the conversation's directory (created if
  missing), in an environment built from scratch: nothing of the runtime's own (its
  bearer token above all) is passed on.
- ``python`` uses the conversation's ``PythonKernel`` (state persists across calls);
  ``bash`` a fresh process. A non-zero exit code or an exception is data in the result.
- At most ``max_concurrent`` executions run at once; a call waits up to its own timeout
  for a slot, then gets 429. Running executions count as activity (``Activity.track``).
- Kernels idle longer than ``kernel_idle_seconds`` are reaped; deleting a conversation
  kills its kernel first, so no process keeps its directory alive.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time

from .activity import Activity
from .bash import run_bash
from .confinement import Confinement
from .errors import ApiError
from .kernel import PythonKernel
from .output import EventSink, OutputCollector
from .schemas import ExecuteRequest, ExecutionResult
from .workspace import Workspace

_SAFE_PATH = "/usr/local/bin:/usr/bin:/bin"


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
    ) -> None:
        self.confinement = confinement
        self.workspace = workspace
        self.activity = activity
        self.output_cap = output_cap
        self.kernel_idle_seconds = kernel_idle_seconds
        self.run_as = run_as
        self._slots = asyncio.Semaphore(max_concurrent)
        self._kernels: dict[str, PythonKernel] = {}

    def environment(self, cwd: str) -> dict[str, str]:
        """The whole environment executed code sees (nothing inherited by accident)."""
        path = os.environ.get("PATH", _SAFE_PATH)
        return {
            "PATH": path,
            "HOME": "/tmp",
            "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8",
            "PYTHONUNBUFFERED": "1",
            "PYTHONDONTWRITEBYTECODE": "1",
            "MPLBACKEND": "Agg",
            "MPLCONFIGDIR": os.path.join("/tmp", f"mpl-{os.getuid()}"),
            "TMPDIR": "/tmp",
            "WORKSPACE_DIR": cwd,
        }

    async def execute(
        self, conversation_id: str, request: ExecuteRequest, on_event: EventSink | None = None
    ) -> ExecutionResult:
        cid = self.workspace.ensure_layout(conversation_id)
        cwd = self.workspace.real_path(cid)
        collector = OutputCollector(self.output_cap, on_event)
        started = time.perf_counter()
        try:
            async with asyncio.timeout(request.timeout):
                await self._slots.acquire()
        except TimeoutError:
            raise TooBusy("every execution slot is busy; retry shortly") from None
        try:
            with self.activity.track():
                user, group = self.run_as or (None, None)
                if request.language == "python":
                    kernel = self._kernel(cid, cwd)
                    error, restarted = await kernel.execute(
                        request.code, request.timeout, collector
                    )
                    exit_code = 0 if error is None else 1
                else:
                    restarted = False
                    exit_code, error = await run_bash(
                        request.code,
                        cwd=cwd,
                        env=self.environment(cwd),
                        timeout=request.timeout,
                        collector=collector,
                        confinement=self.confinement,
                        user=user,
                        group=group,
                    )
        finally:
            self._slots.release()
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

    def _kernel(self, cid: str, cwd: str) -> PythonKernel:
        kernel = self._kernels.get(cid)
        if kernel is None:
            user, group = self.run_as or (None, None)
            kernel = PythonKernel(
                cwd, self.environment(cwd), self.confinement, user=user, group=group
            )
            self._kernels[cid] = kernel
        return kernel

    async def restart(self, conversation_id: str) -> bool:
        """Kill the conversation's interpreter; the next call starts a fresh one."""
        cid = self.workspace.check_conversation_id(conversation_id)
        kernel = self._kernels.pop(cid, None)
        if kernel is None:
            return False
        await kernel.kill()
        return True

    async def reap_idle(self) -> list[str]:
        now = time.monotonic()
        idle = [
            cid
            for cid, k in self._kernels.items()
            if not k.busy and now - k.last_used > self.kernel_idle_seconds
        ]
        for cid in idle:
            await self._kernels.pop(cid).kill()
        return idle

    async def reap_forever(self, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            with contextlib.suppress(Exception):
                await self.reap_idle()

    async def aclose(self) -> None:
        kernels, self._kernels = self._kernels, {}
        await asyncio.gather(*(k.kill() for k in kernels.values()), return_exceptions=True)
        self.confinement.close()
