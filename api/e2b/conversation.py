"""Run work in an E2B sandbox's conversation through the API's own execution path.

Everything the data plane does to files or processes is code run by the runtime in the
conversation's directory (``RuntimeClient.execute_*``), opened before and checked after
exactly as ``/api/v1/sessions/{id}/execute`` does (``conversation_opened`` /
``conversation_written``): the same confinement, quotas and deletion guarantee, and no
second way into the sandbox. File operations are a small Python program run with bash
(a fresh process, so the kernel's state and execution count are untouched).
"""

from __future__ import annotations

import json
import shlex
from collections.abc import AsyncIterator
from dataclasses import dataclass

from sandbox_workspace.contract.errors import ApiError, BadGateway, BadRequest, NotFoundError
from sandbox_workspace.runtime.schemas import ExecuteRequest, ExecutionResult

from ..backends.base import ConversationPhase, Session
from ..deps import Services
from ..identity import Caller
from ..routes.execute import _then
from ..runtime_client import RuntimeClient
from .ids import SandboxNotFound, conversation_of, is_attached
from .lifetimes import lifetimes

# Per conversation: the code interpreter's execution count (our kernel keeps none); this
# process's count, dropped at kill.
EXECUTIONS: dict[str, int] = {}

# One operation per call: argv[1] is {"op", "path", …} with paths relative to the cwd
# (the conversation's directory); prints one JSON line: {"ok": …} or {"error", "kind"}.
FS_PROGRAM = r"""
import base64, json, os, shutil, stat, sys, datetime
a = json.loads(sys.argv[1])
def info(rel):
    p = rel or "."
    st = os.lstat(p)
    return {"name": os.path.basename(rel) if rel else "user", "rel": rel,
            "dir": stat.S_ISDIR(st.st_mode), "size": st.st_size, "mode": st.st_mode & 0o7777,
            "perm": stat.filemode(st.st_mode),
            "mtime": datetime.datetime.fromtimestamp(st.st_mtime, datetime.timezone.utc)
                .strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
            "link": os.readlink(p) if stat.S_ISLNK(st.st_mode) else None}
def run():
    op, rel = a["op"], a.get("path", "")
    p = rel or "."
    if op == "stat":
        return info(rel)
    if op == "list":
        out, todo = [], [(rel, 1)]
        if not os.path.isdir(p):
            raise NotADirectoryError(rel)
        while todo:
            d, depth = todo.pop()
            for n in sorted(os.listdir(d or ".")):
                r = f"{d}/{n}" if d else n
                e = info(r)
                out.append(e)
                if e["dir"] and depth < a.get("depth", 1):
                    todo.append((r, depth + 1))
        return out
    if op == "mkdir":
        if os.path.exists(p):
            raise FileExistsError(rel)
        os.makedirs(p)
        return info(rel)
    if op == "move":
        d = a["dest"]
        if os.path.dirname(d):
            os.makedirs(os.path.dirname(d), exist_ok=True)
        os.rename(p, d)
        return info(d)
    if op == "remove":
        if os.path.isdir(p) and not os.path.islink(p):
            shutil.rmtree(p)
        else:
            os.remove(p)
        return None
    if op == "read":
        with open(p, "rb") as f:
            return base64.b64encode(f.read()).decode()
    if op == "write":
        if os.path.dirname(rel):
            os.makedirs(os.path.dirname(rel), exist_ok=True)
        with open(p, "wb") as f:
            f.write(base64.b64decode(a["data"]))
        return info(rel)
try:
    print(json.dumps({"ok": run()}))
except FileNotFoundError as e:
    print(json.dumps({"error": f"{a.get('path')}: not found", "kind": "not_found"}))
except FileExistsError as e:
    print(json.dumps({"error": f"{a.get('path')}: already exists", "kind": "exists"}))
except (NotADirectoryError, IsADirectoryError) as e:
    print(json.dumps({"error": f"{e.__class__.__name__}: {e}", "kind": "invalid"}))
except OSError as e:
    print(json.dumps({"error": f"{e.__class__.__name__}: {e.strerror}", "kind": "invalid"}))
"""


class PathNotFound(NotFoundError):
    code = "path_not_found"


class PathExists(ApiError):
    status = 409
    code = "path_exists"


@dataclass
class Sandbox:
    """An E2B sandbox resolved to its running session and conversation."""

    services: Services
    session: Session
    cid: str

    @classmethod
    async def open(cls, services: Services, caller: Caller, sandbox_id: str) -> Sandbox:
        if is_attached(sandbox_id) and lifetimes(services).remaining(sandbox_id) is None:
            # Detached (killed or timed out), or attached on another API process.
            raise SandboxNotFound(f"sandbox '{sandbox_id}' not found (detached)")
        session = await services.sessions.ensure_running(caller, caller.session_id)
        cid = conversation_of(sandbox_id)
        if not await _exists(services, session, sandbox_id, cid):
            raise SandboxNotFound(f"sandbox '{sandbox_id}' not found (killed, or not yours)")
        await services.backend.conversation_opened(session, cid)
        return cls(services, session, cid)

    @property
    def client(self) -> RuntimeClient:
        return client(self.services, self.session)

    async def run(self, request: ExecuteRequest) -> ExecutionResult:
        raw = await self.client.execute_raw(self.cid, request)
        await self.services.backend.conversation_written(self.session, self.cid)
        return ExecutionResult.model_validate_json(raw)

    def stream(self, request: ExecuteRequest) -> AsyncIterator[dict]:
        """The runtime's events (stdout/stderr/result, then done or error), with the
        after-write check before ``done`` as the execute route does."""
        return _then(
            self.client.execute_stream(self.cid, request),
            self.services.backend,
            self.session,
            self.cid,
        )

    async def fs(self, op: str, path: str, **args):
        """One file operation (``FS_PROGRAM``); its answer, or the matching API error."""
        argument = json.dumps({"op": op, "path": path, **args})
        code = f"python3 -c {shlex.quote(FS_PROGRAM)} {shlex.quote(argument)}"
        result = await self.run(ExecuteRequest(language="bash", code=code, timeout=60))
        try:
            answer = json.loads(result.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            if result.error is not None and result.error.code:
                raise BadRequest(result.error.value, code=result.error.code) from None
            raise BadGateway(f"file operation failed: {result.stderr.strip()[-500:]}") from None
        if "ok" in answer:
            return answer["ok"]
        kind, message = answer.get("kind"), answer.get("error", "failed")
        if kind == "not_found":
            raise PathNotFound(message)
        if kind == "exists":
            raise PathExists(message)
        raise BadRequest(message, code="invalid_path")


async def _exists(services: Services, session: Session, sandbox_id: str, cid: str) -> bool:
    """Whether the sandbox's conversation is there. A fresh sandbox's (a checked hex id):
    the backend's own record (kubernetes: its ConversationWorkspace, from the watch cache)
    — one runtime round trip less per call than the listing (bench e2b on the node), and
    no cost growing with the session's conversations. An attached one's name comes from
    the caller's metadata: only the runtime's listing is asked about it (no path is made
    of it here). Not READY there (another replica's watch may not have seen a create made
    a moment ago): the listing decides, as before; DELETING is gone already."""
    if not is_attached(sandbox_id):
        phase = await services.backend.conversation_phase(session, cid)
        if phase != ConversationPhase.ABSENT:
            return phase == ConversationPhase.READY
    return cid in await client(services, session).list_conversations()


def client(services: Services, session: Session) -> RuntimeClient:
    assert session.endpoint is not None, "the session runs (ensure_running)"
    return RuntimeClient(services.http, session.endpoint)
