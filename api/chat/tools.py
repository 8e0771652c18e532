"""The agent's tools, each bound to one session's runtime and one conversation.

Contract: ``SandboxTools.call(name, arguments_json)`` never raises for the model's mistakes
(unknown tool, malformed arguments, a failing command): it returns a ``ToolOutcome`` with
``ok=False`` and a message the model can act on. Arguments are checked against the tool's
declared schema first (``chat.arguments``): undeclared keys are ignored, a wrong type or
value is answered naming the field, what is expected and how to call the tool. Outputs
sent back to the model are cut to ``output_limit`` characters with a note saying how much
was cut. File tools run as small Python programs in the conversation's directory
(arguments passed as ``repr`` literals, never spliced into code), so the runtime stays the
one place that touches files.
``present_file`` accepts only existing files under this conversation's outputs/ or
uploads and records a download URL for the ``result`` event.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from pydantic import ValidationError

from sandbox_workspace.contract.errors import ApiError
from sandbox_workspace.kube import KubeError
from sandbox_workspace.runtime.schemas import ExecuteRequest, ExecutionError, ExecutionResult

from ..backends import kube_errors
from ..file_refs import parse_file_ref
from ..runtime_client import RuntimeClient
from .arguments import InvalidArguments, check_arguments, usage


def _fn(name: str, description: str, properties: dict, required: list[str]) -> dict:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": properties, "required": required},
        },
    }


_TIMEOUT = {
    "type": "number",
    "exclusiveMinimum": 0,
    "description": "Seconds before the call is killed.",
}
_TEXT = {"type": "string", "minLength": 1}
TOOL_SPECS: dict[str, dict] = {
    "execute_code": _fn(
        "execute_code",
        "Run Python in a persistent interpreter (variables "
        "survive between calls) in the conversation's directory.",
        {"code": _TEXT, "timeout": _TIMEOUT},
        ["code"],
    ),
    "bash": _fn(
        "bash",
        "Run a bash command in the conversation's directory.",
        {"command": _TEXT, "timeout": _TIMEOUT},
        ["command"],
    ),
    "list_files": _fn(
        "list_files", "List the user's uploads and the outputs written so far.", {}, []
    ),
    "read_file": _fn(
        "read_file",
        "Read a text file (relative to the conversation's "
        "directory, or a full path); long files are cut.",
        {
            "path": _TEXT,
            "max_bytes": {"type": "integer", "minimum": 1, "maximum": 65536},
        },
        ["path"],
    ),
    "glob_search": _fn(
        "glob_search",
        "Find files by glob pattern (** recurses), relative to the conversation's directory.",
        {"pattern": _TEXT},
        ["pattern"],
    ),
    "grep_search": _fn(
        "grep_search",
        "Search file contents with a regular expression.",
        {
            "pattern": _TEXT,
            "path": {
                **_TEXT,
                "description": "Directory or file; default the conversation's directory.",
            },
        },
        ["pattern"],
    ),
    "present_file": _fn(
        "present_file",
        "Offer a file you wrote under outputs/ to the user for download.",
        {"path": _TEXT},
        ["path"],
    ),
}
TOOL_NAMES = list(TOOL_SPECS)

_READ_FILE = """
import os
p = {path!r}
n = {limit!r}
if not {inside}(p):
    raise PermissionError(f'{{p}} is outside the working directory')
with open(p, 'rb') as f:
    data = f.read(n + 1)
size = os.path.getsize(p)
text = data[:n].decode('utf-8', 'replace')
print(text, end='')
if size > n:
    print(f'\\n[... {{size - n}} more bytes not shown]', end='')
"""
_ROOTED = """
import os as _sbw_os
def _sbw_inside(p, _root=_sbw_os.path.realpath({root!r})):
    real = _sbw_os.path.realpath(p)
    return real == _root or real.startswith(_root + _sbw_os.sep)
"""
_GLOB = """
import glob
hits = sorted(h for h in glob.glob({pattern!r}, recursive=True) if {inside}(h))
print('\\n'.join(hits[:200]) or '(no matches)')
if len(hits) > 200:
    print(f'[... {{len(hits) - 200}} more]')
"""
_GREP = """
import os, re
rx = re.compile({pattern!r})
root = {path!r}
if not {inside}(root):
    raise PermissionError(f'{{root}} is outside the working directory')
hits = []
paths = [root] if os.path.isfile(root) else [
    os.path.join(d, f) for d, _, fs in os.walk(root) for f in sorted(fs)]
for p in paths:
    if len(hits) >= 200:
        break
    try:
        with open(p, encoding='utf-8', errors='replace') as fh:
            for i, line in enumerate(fh, 1):
                if rx.search(line):
                    hits.append(f'{{p}}:{{i}}: {{line.rstrip()[:300]}}')
                    if len(hits) >= 200:
                        break
    except OSError:
        pass
print('\\n'.join(hits) or '(no matches)')
"""


@dataclass
class ToolOutcome:
    ok: bool
    output: str
    duration_ms: float = 0.0
    data: dict[str, Any] = field(default_factory=dict)


@dataclass
class PresentedFile:
    name: str
    path: str
    download_url: str


class SandboxTools:
    def __init__(
        self,
        client: RuntimeClient,
        *,
        session_id: str,
        conversation_id: str,
        workspace_path: str,
        exec_timeout: float = 120.0,
        output_limit: int = 8000,
        root: str | None = None,
        read_only: list[str] | None = None,
    ) -> None:
        self.client = client
        self.session_id = session_id
        self.cid = conversation_id
        self.workspace_path = workspace_path
        self.exec_timeout = exec_timeout
        self.output_limit = output_limit
        self.presented: list[PresentedFile] = []
        # The file tools' root (seed 002's workingDirectory): paths resolve from it and
        # may not leave it. None: the conversation's directory, unrestricted.
        self.root = root
        # Top-level names of the conversation the model's bash calls may not change
        # (seed 002's readonly nodes; enforced by the runtime with Landlock).
        self.read_only = read_only or []

    async def call(self, name: str, arguments: str) -> ToolOutcome:
        started = time.perf_counter()
        handler = getattr(self, f"_{name}", None)
        if name not in TOOL_SPECS or handler is None:
            return ToolOutcome(False, f"unknown tool '{name}'; available: {', '.join(TOOL_NAMES)}")
        parameters = TOOL_SPECS[name]["function"]["parameters"]
        try:
            args = check_arguments(name, arguments, parameters)
        except InvalidArguments as e:
            return ToolOutcome(
                False, f"invalid arguments for {name}: {e}. Call it as {usage(name, parameters)}."
            )
        try:
            outcome = await handler(**args)
        except ValidationError as e:  # the runtime's own request rules (e.g. NUL in code)
            problems = "; ".join(f"{'.'.join(map(str, x['loc']))}: {x['msg']}" for x in e.errors())
            outcome = ToolOutcome(False, f"invalid arguments for {name}: {problems}")
        except ApiError as e:
            outcome = ToolOutcome(False, f"{name} failed: {e.message}")
        except KubeError as e:  # told to the model as the API tells its callers
            outcome = ToolOutcome(False, f"{name} failed: {kube_errors.api_error(e).message}")
        outcome.output = self._cut(outcome.output)
        outcome.duration_ms = round((time.perf_counter() - started) * 1000, 1)
        return outcome

    def _cut(self, text: str) -> str:
        if len(text) <= self.output_limit:
            return text
        return (
            text[: self.output_limit] + f"\n[... {len(text) - self.output_limit} more "
            "characters cut]"
        )

    async def _run(
        self, language: str, code: str, timeout: float | None = None, read_only: list[str] = ()
    ) -> ExecutionResult:
        limit = min(float(timeout) if timeout else self.exec_timeout, self.exec_timeout)
        request = ExecuteRequest(
            language=language, code=code, timeout=limit, read_only=list(read_only)
        )
        return await self.client.execute(self.cid, request)

    async def run_trusted(self, language: str, code: str) -> ExecutionResult:
        """Code of ours, not the model's (the table files written and read back)."""
        return await self._run(language, code)

    async def _run_program(self, code: str) -> ToolOutcome:
        if self.root is not None:
            code = _ROOTED.format(root=self.root) + code
        result = await self._run("python", code)
        if result.error:
            return ToolOutcome(False, _error_line(result.error))
        return ToolOutcome(True, result.stdout)

    async def _execute_code(self, code: str, timeout: float | None = None) -> ToolOutcome:
        result = await self._run("python", code, timeout)
        return ToolOutcome(
            result.error is None, _describe(result), data={"exit_code": result.exit_code}
        )

    async def _bash(self, command: str, timeout: float | None = None) -> ToolOutcome:
        result = await self._run("bash", command, timeout, self.read_only)
        return ToolOutcome(
            result.exit_code == 0 and result.error is None,
            _describe(result),
            data={"exit_code": result.exit_code},
        )

    async def _list_files(self) -> ToolOutcome:
        uploads = await self.client.list_uploads(self.cid)
        outputs = await self.client.list_outputs(self.cid)
        lines = ["Uploads:"] + [f"- {f.name} ({f.path}, {f.size} bytes)" for f in uploads.files]
        lines += ["Outputs:"] + [
            f"- {f.relative_path} ({f.path}, {f.size} bytes)" for f in outputs.files
        ]
        return ToolOutcome(True, "\n".join(lines))

    async def _read_file(self, path: str, max_bytes: int = 16384) -> ToolOutcome:
        return await self._run_program(
            _READ_FILE.format(path=self._rooted(path), limit=max_bytes, inside=self._inside)
        )

    async def _glob_search(self, pattern: str) -> ToolOutcome:
        return await self._run_program(
            _GLOB.format(pattern=self._rooted(pattern), inside=self._inside)
        )

    async def _grep_search(self, pattern: str, path: str = ".") -> ToolOutcome:
        return await self._run_program(
            _GREP.format(pattern=pattern, path=self._rooted(path), inside=self._inside)
        )

    def _rooted(self, path: str) -> str:
        return path if self.root is None else os.path.join(self.root, path)

    @property
    def _inside(self) -> str:
        return "(lambda p: True)" if self.root is None else "_sbw_inside"

    async def _present_file(self, path: str) -> ToolOutcome:
        relative = path[2:] if path.startswith("./") else path
        full = (
            path
            if path.startswith("/")
            else f"{self.workspace_path.rstrip('/')}/{self.cid}/{relative}"
        )
        ref = parse_file_ref(full, self.cid, self.workspace_path, allow_outputs=True)
        # It must exist now: present what is there, not a promise.
        if ref.area == "outputs":
            listing = await self.client.list_outputs(self.cid)
            known = {f.relative_path: f.path for f in listing.files}
            shown = known.get("/".join(ref.parts))
        else:
            uploads = await self.client.list_uploads(self.cid)
            shown = next((f.path for f in uploads.files if f.name == ref.name), None)
        if shown is None:
            return ToolOutcome(False, f"no file at {full}; write it under outputs/ first")
        url = (
            f"/api/v1/sessions/{quote(self.session_id, safe='')}/files/"
            f"{quote(shown.lstrip('/'), safe='/')}"
        )
        presented = PresentedFile(name=ref.name, path=shown, download_url=url)
        if all(p.path != shown for p in self.presented):
            self.presented.append(presented)
        return ToolOutcome(
            True, f"presented {shown} to the user", data={"download_url": url, "path": shown}
        )


def _error_line(error: ExecutionError) -> str:
    """A limit hit names its code first, so the model knows what to change (less memory,
    fewer or smaller files) rather than retrying the same code."""
    line = f"{error.name}: {error.value}"
    return f"{error.code} — {line}" if error.code else line


def _describe(result: ExecutionResult) -> str:
    parts = []
    if result.stdout:
        parts.append(result.stdout)
    if result.stderr:
        parts.append(f"[stderr]\n{result.stderr}")
    for r in result.results:
        if "text/plain" in r.data:
            parts.append(f"[result] {r.data['text/plain']}")
        images = [m for m in r.data if m.startswith("image/")]
        if images:
            parts.append(f"[{', '.join(images)} output shown to the user]")
    if result.error:
        parts.append(f"[error] {_error_line(result.error)}")
        if result.error.traceback:
            parts.append(result.error.traceback)
    if result.exit_code and not result.error:
        parts.append(f"[exit code {result.exit_code}]")
    if result.truncated:
        parts.append("[output was truncated]")
    return "\n".join(parts) or "(no output)"
