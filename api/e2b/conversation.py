"""Run work in an E2B sandbox's conversation through the API's own execution path.

Everything the data plane does to files or processes is code run by the runtime in the
conversation's directory (``RuntimeClient.execute_*``), opened before and checked after
exactly as ``/api/v1/sessions/{id}/execute`` does (``conversation_opened`` /
``conversation_written``): the same confinement, quotas and deletion guarantee, and no
second way into the sandbox. File operations are a small Python program run with bash
(a fresh process, so the kernel's state and execution count are untouched).

A fresh sandbox's home (``/home/user``) is the conversation's ``outputs/``: all its work
starts there (``in_home``), so what E2B code writes is an output, which store mode ``s3``
writes back (docs/e2b.md "Paths" says why); an attached chat conversation keeps the
chat's layout. A sandbox the runtime does not list may still exist (``kept``: the backend
tracks it, or the store holds it) and is then filled before use.
"""

from __future__ import annotations

import ast
import contextlib
import json
import shlex
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from sandbox_workspace.contract.errors import ApiError, BadGateway, BadRequest, NotFoundError
from sandbox_workspace.contract.ids import UnsafePath, check_conversation_id
from sandbox_workspace.runtime.client import RuntimeUnavailable
from sandbox_workspace.runtime.schemas import ExecuteRequest, ExecutionResult

from ..backends.base import ConversationPhase, Session
from ..backends.store_backend import StoreBackend
from ..deps import Services
from ..identity import Caller
from ..routes.execute import _then
from ..runtime_client import RuntimeClient
from .ids import SandboxNotFound, conversation_of, is_attached
from .state import lifetimes

# Per sandbox (``Sandbox.key``: tenant, user, conversation — a conversation id is the
# user's own name, and another tenant's user may have the same one): the code
# interpreter's execution count (our kernel keeps none); this process's count, dropped at
# kill or detach, and bounded (least recently counted first) against whatever else ends
# a conversation: a count dropped only numbers that sandbox's next cell 1 again.
EXECUTIONS: OrderedDict[tuple[str, str, str], int] = OrderedDict()
MAX_COUNTED = 10_000


def count_execution(key: tuple[str, str, str]) -> int:
    """The sandbox's next execution count."""
    count = EXECUTIONS[key] = EXECUTIONS.pop(key, 0) + 1
    while len(EXECUTIONS) > MAX_COUNTED:
        EXECUTIONS.popitem(last=False)
    return count


# One operation per call: its argv, joined, is {"op", "path", …} (in pieces of at most
# ``_ARG_PIECE``: one argument of execve holds at most 128 KiB, and a 120 KB file's base64
# failed "Argument list too long") with paths relative to the cwd (the conversation's
# directory); prints one JSON line: {"ok": …} or {"error", "kind"}.
# ``write_many`` writes {"files": [{"path", "data"}, …]} in order, stopping at the first
# that fails (its path in the error): a multipart upload of many files is one program,
# not one per file (~80 ms each: 200 files took 15 s). Python runs isolated (``-I``): by
# ``-c`` from home, the cwd came first on ``sys.path``, so a ``json.py`` or
# ``datetime.py`` there (code's, or the user's own) ran inside every file call.
FS_PROGRAM = r"""
import base64, json, os, shutil, stat, sys, datetime
a = json.loads("".join(sys.argv[1:]))
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
    if op == "write_many":
        out = []
        for w in a["files"]:
            a["path"] = w["path"]  # an error names the file it stopped at
            d = os.path.dirname(w["path"])
            if d:
                os.makedirs(d, exist_ok=True)
            with open(w["path"], "wb") as f:
                f.write(base64.b64decode(w["data"]))
            out.append(info(w["path"]))
        return out
try:
    print(json.dumps({"ok": run()}))
except FileNotFoundError as e:
    print(json.dumps({"error": f"{a.get('path')}: not found", "kind": "not_found"}))
except FileExistsError as e:
    print(json.dumps({"error": f"{a.get('path')}: already exists", "kind": "exists"}))
except (NotADirectoryError, IsADirectoryError) as e:
    print(json.dumps({"error": f"{e.__class__.__name__}: {e}", "kind": "invalid"}))
except OSError as e:
    print(json.dumps({"error": f"{a.get('path')}: {e.__class__.__name__}: {e.strerror}",
                      "kind": "invalid"}))
else:
    sys.exit(0)
sys.exit(1)  # failed: a frozen conversation's call says why (``frozen_outcome``)
"""


# A fresh sandbox's /home/user is its conversation's outputs/ (docs/e2b.md "Paths"): what
# E2B code writes there is an output, written back to the store in ``s3`` mode and listed
# as the conversation's files. Every command starts there with HOME set to it; the
# interpreter goes there once per kernel (``__e2b_home__`` marks that it did).
BASH_HOME = '[ -d outputs ] || mkdir -p outputs 2>/dev/null; cd outputs && export HOME="$PWD"; '
_PY_SETUP = (
    "import os as o, sys as s\n"
    "h = o.path.join(o.environ.get('WORKSPACE_DIR') or o.getcwd(), 'outputs')\n"
    "o.makedirs(h, exist_ok=True); o.chdir(h); o.environ['HOME'] = h; s.path.insert(0, h)"
)
# One simple statement (never displayed, never a block): it can open the cell's first
# line. The setup runs in a namespace of its own: the cell's globals gain only the mark.
PY_HOME = (
    '__e2b_home__ = globals().get("__e2b_home__") '
    f'or (lambda n: (exec({_PY_SETUP!r}, n), n["h"])[1])({{}})'
)
_COMPOUND = (
    ast.If, ast.For, ast.AsyncFor, ast.While, ast.With, ast.AsyncWith, ast.Try,
    ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Match,
)  # fmt: skip
if hasattr(ast, "TryStar"):
    _COMPOUND += (ast.TryStar,)


_ARG_PIECE = 64 * 1024
_PIECES_MARGIN = 256  # the quotes and spaces between a batch's pieces


def fs_code(argument: dict) -> str:
    """The bash code of one ``FS_PROGRAM`` call (before ``in_home``'s prefix)."""
    text = json.dumps(argument)
    pieces = [text[at : at + _ARG_PIECE] for at in range(0, len(text), _ARG_PIECE)]
    return f"python3 -I -c {shlex.quote(FS_PROGRAM)} " + " ".join(map(shlex.quote, pieces))


def write_batches(files: list[tuple[str, str]], budget: int) -> list[list[tuple[str, str]]]:
    """``files`` ((path, base64 data), in order) in consecutive batches whose
    ``write_many`` code fits ``budget`` bytes each; a file alone past it is a batch of its
    own (the caller bounds a file's size). Quoting is per character, so a batch's code is
    its empty call plus each file's own quoted entry and separator (and a few bytes a
    piece: ``_PIECES_MARGIN``)."""
    base = len(fs_code({"op": "write_many", "path": "", "files": []}).encode()) + _PIECES_MARGIN
    batches: list[list[tuple[str, str]]] = []
    size = budget  # no batch open yet
    for path, data in files:
        cost = len(shlex.quote(json.dumps({"path": path, "data": data})).encode()) + 2
        if size + cost > budget:
            batches.append([])
            size = base
        batches[-1].append((path, data))
        size += cost
    return batches


def python_in_home(code: str) -> str:
    """The cell with ``PY_HOME`` before it, on its first line where that keeps every line
    number (tracebacks name the cell's lines): in place of a blank or comment line, or
    before a simple statement; on a line of its own otherwise (a cell opening with a
    block: its line numbers are one more)."""
    first, newline, rest = code.partition("\n")
    if not first.strip() or first.lstrip().startswith("#"):
        return PY_HOME + newline + rest
    try:
        body = ast.parse(code).body
    except SyntaxError:
        return PY_HOME + "\n" + code
    head = body[0] if body else None
    if isinstance(head, ast.ImportFrom) and head.module == "__future__":
        return code  # must stay first: this cell keeps the kernel's directory
    simple = head is not None and not isinstance(head, _COMPOUND)
    if simple and head.lineno == 1 and head.col_offset == 0:
        return f"{PY_HOME}; {code}"
    return PY_HOME + "\n" + code


def in_home(request: ExecuteRequest) -> ExecuteRequest:
    """The request run from the sandbox's home (outputs/)."""
    bash = request.language == "bash"
    code = BASH_HOME + request.code if bash else python_in_home(request.code)
    return request.model_copy(update={"code": code})


class PathNotFound(NotFoundError):
    code = "path_not_found"


class QuotaFull(ApiError):
    """A write refused because the conversation is over its quota (a frozen call)."""

    status, code = 413, "conversation_quota_exceeded"


class PathExists(ApiError):
    status = 409
    code = "path_exists"


@dataclass
class Sandbox:
    """An E2B sandbox resolved to its running session and conversation."""

    services: Services
    session: Session
    cid: str
    attached: bool = False
    caller: Caller = field(kw_only=True)

    @property
    def key(self) -> tuple[str, str, str]:
        """Whose sandbox this is, in full: conversation ids repeat across users."""
        return (self.caller.tenant, self.caller.user_id, self.cid)

    @classmethod
    async def open(cls, services: Services, caller: Caller, sandbox_id: str) -> Sandbox:
        timers = lifetimes(services)
        if (timers.shared or is_attached(sandbox_id)) and await timers.remaining(
            caller, sandbox_id
        ) is None:
            # Killed, timed out or detached (an attached sandbox lives by its timer; so
            # does every sandbox when timers are shared, since they outlive API processes).
            raise SandboxNotFound(f"sandbox '{sandbox_id}' not found (killed or timed out)")
        # E2B's create answered this caller's session a moment ago (the SDK's next call is
        # its command's Start): not read again (``SessionService.recent_running``).
        session = await services.sessions.recent_running(caller)
        cid = conversation_of(sandbox_id)
        sandbox = cls(services, session, cid, attached=is_attached(sandbox_id), caller=caller)
        try:
            if not await _tracked(services, session, sandbox_id, cid) and not (
                cid in await sandbox.client.list_conversations()
                or await kept(services, session, cid)
            ):
                raise SandboxNotFound(f"sandbox '{sandbox_id}' not found (killed, or not yours)")
            # Fills it from the store (a runtime call of the backend's own).
            await services.backend.conversation_opened(session, cid)
        except RuntimeUnavailable:
            sandbox.unreachable()
            raise
        return sandbox

    @property
    def client(self) -> RuntimeClient:
        return client(self.services, self.session, on_unreachable=self.unreachable)

    def unreachable(self) -> None:
        """Its runtime did not answer: maybe a crash or a new pod since the session
        answer this call reused (``recent_running``), so the caller's next call looks the
        session up again instead of failing the same way."""
        self.services.sessions.forget(self.caller)

    def _at_home(self, request: ExecuteRequest) -> ExecuteRequest:
        # An attached chat conversation keeps the chat's layout: home is its directory.
        return request if self.attached else in_home(request)

    async def run(self, request: ExecuteRequest) -> ExecutionResult:
        raw = await self.client.execute_raw(self.cid, self._at_home(request))
        await self.services.backend.conversation_written(self.session, self.cid)
        return ExecutionResult.model_validate_json(raw)

    def stream(self, request: ExecuteRequest) -> AsyncIterator[dict]:
        """The runtime's events (stdout/stderr/result, then done or error), with the
        after-write check before ``done`` as the execute route does."""
        return _then(
            self.client.execute_stream(self.cid, self._at_home(request)),
            self.services.backend,
            self.session,
            self.cid,
        )

    async def _drop_stored(self, rel: str) -> None:
        """An SDK file call removed (or moved away) ``rel`` of a fresh sandbox's home: its
        files leave the store too (``s3`` mode), or a new cache would be filled with them
        again. An attached chat conversation's files are left as the chat has them."""
        backend = self.services.backend
        if self.attached or not isinstance(backend, StoreBackend):
            return
        base = f"outputs/{rel}" if rel else "outputs"
        manifest = await backend.meta.get(backend.scope(self.session), self.cid)
        for record in manifest.files if manifest else []:
            path = record.file_path
            if record.active and (path == base or path.startswith(base + "/")):
                with contextlib.suppress(NotFoundError):  # deleted meanwhile
                    await backend.delete_file(self.session, self.cid, record.file_id)

    async def fs(self, op: str, path: str, **args):
        """One file operation (``FS_PROGRAM``); its answer, or the matching API error."""
        code = fs_code({"op": op, "path": path, **args})
        result = await self.run(ExecuteRequest(language="bash", code=code, timeout=60))
        try:
            answer = json.loads(result.stdout.strip().splitlines()[-1])
            if not isinstance(answer, dict):  # not the program's: the code's forgery
                raise ValueError(answer)
        except (ValueError, IndexError):
            if result.error is not None and result.error.code:
                raise BadRequest(result.error.value, code=result.error.code) from None
            raise BadGateway(f"file operation failed: {result.stderr.strip()[-500:]}") from None
        if "ok" in answer:
            if op in ("remove", "move"):
                await self._drop_stored(path)
            return answer["ok"]
        kind, message = answer.get("kind"), answer.get("error", "failed")
        quota = result.error is not None and result.error.code == "conversation_quota_exceeded"
        if kind == "invalid" and quota:  # refused for the quota, not for the path
            raise QuotaFull(f"{message}: {result.error.value}")
        if kind == "not_found":
            raise PathNotFound(message)
        if kind == "exists":
            raise PathExists(message)
        raise BadRequest(message, code="invalid_path")


async def _tracked(services: Services, session: Session, sandbox_id: str, cid: str) -> bool:
    """A fresh sandbox's conversation (a checked hex id) the backend tracks as READY
    (kubernetes: its ConversationWorkspace, from the watch cache): found without the
    runtime's listing — one round trip less per call (bench e2b on the node) and no cost
    growing with the session's conversations. Otherwise (an attached id, which comes from
    the caller's metadata; or not READY, e.g. another replica's watch not caught up) the
    listing and ``kept`` decide."""
    if is_attached(sandbox_id):
        return False
    return await services.backend.conversation_phase(session, cid) == ConversationPhase.READY


async def kept(services: Services, session: Session, cid: str) -> bool:
    """Whether a conversation the runtime does not list exists all the same: tracked by
    the backend (kubernetes: its ConversationWorkspace), or held by the store (``s3``
    mode: a new runtime, or one restarted, lists only what it was given so far). An id
    no conversation may have (an attached one decodes to anything) is not looked up."""
    try:
        if check_conversation_id(cid) != cid:
            return False
    except UnsafePath:
        return False
    backend = services.backend
    if await backend.conversation_phase(session, cid) == ConversationPhase.READY:
        return True
    if isinstance(backend, StoreBackend):
        return await backend.meta.get(backend.scope(session), cid) is not None
    return False


def client(
    services: Services, session: Session, *, on_unreachable: Callable[[], None] | None = None
) -> RuntimeClient:
    assert session.endpoint is not None, "the session runs (ensure_running)"
    return RuntimeClient(services.http, session.endpoint, on_unreachable=on_unreachable)
