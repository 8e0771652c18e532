"""The persistent Python interpreter behind ``language: python`` (runs as its own process).

Protocol with the runtime (``runtime/kernel.py``), over two inherited pipe fds named by
``SBW_KERNEL_CMD_FD`` / ``SBW_KERNEL_EVT_FD``: the runtime writes one JSON line per
command ``{"id", "code", "sentinel"}``; this process answers with JSON lines ``{"type":
"ready"}`` once, then per command any number of ``{"type": "result", "data": {...}}``
(rich display data) and one ``{"type": "done", "id", "error"}``. stdout and stderr are
the process's real fds 1 and 2 (so output of child processes is captured too), written
through without buffering; after each command the sentinel is written to both, so the
runtime knows it has read every byte the command produced.

State (variables, imports) lives in one namespace for the process's lifetime. The last
expression of a cell is displayed, IPython-style; matplotlib figures are returned as PNG.
Stdlib only: this file must import nothing that user code could have broken.
"""

from __future__ import annotations

import ast
import base64
import builtins
import contextlib
import io
import json
import os
import sys
import traceback
import types

_FILENAME = "<cell>"


class _Channel:
    def __init__(self, fd: int) -> None:
        self.fd = fd

    def send(self, message: dict) -> None:
        data = (json.dumps(message, default=str) + "\n").encode()
        view = memoryview(data)
        while view:
            view = view[os.write(self.fd, view) :]


def _mime_bundle(value: object) -> dict[str, str]:
    data = {"text/plain": repr(value)}
    for method, mime in (
        ("_repr_html_", "text/html"),
        ("_repr_svg_", "image/svg+xml"),
        ("_repr_png_", "image/png"),
        ("_repr_markdown_", "text/markdown"),
    ):
        fn = getattr(value, method, None)
        if not callable(fn):
            continue
        try:
            out = fn()
        except Exception:  # a broken repr must not fail the cell
            continue
        if out is None:
            continue
        data[mime] = base64.b64encode(out).decode() if isinstance(out, bytes) else str(out)
    return data


def _figures() -> list[dict[str, str]]:
    plt = sys.modules.get("matplotlib.pyplot")
    if plt is None:
        return []
    bundles = []
    for num in plt.get_fignums():
        figure = plt.figure(num)
        buf = io.BytesIO()
        figure.savefig(buf, format="png", bbox_inches="tight")
        bundles.append(
            {"text/plain": repr(figure), "image/png": base64.b64encode(buf.getvalue()).decode()}
        )
    plt.close("all")
    return bundles


def _user_traceback(exc: BaseException) -> str:
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename != __file__]
    lines = [
        "Traceback (most recent call last):\n",
        *traceback.format_list(frames),
        *traceback.format_exception_only(type(exc), exc),
    ]
    return "".join(lines)


class Kernel:
    def __init__(self, events: _Channel) -> None:
        self.events = events
        # The cells' namespace is a real module registered as ``__main__`` (as Jupyter's
        # is): functions defined in a cell pickle by reference, so process pools
        # (multiprocessing, concurrent.futures, joblib) can send them to workers.
        main = types.ModuleType("__main__")
        main.__dict__.update({"__builtins__": builtins, "display": self.display})
        sys.modules["__main__"] = main
        self.namespace: dict = main.__dict__

    def display(self, *values: object) -> None:
        for value in values:
            self.events.send({"type": "result", "data": _mime_bundle(value)})

    def run(self, code: str) -> dict | None:
        """Execute a cell; returns the error dict or None."""
        try:
            tree = ast.parse(code, _FILENAME, "exec")
            last = None
            if tree.body and isinstance(tree.body[-1], ast.Expr):
                last = ast.Expression(tree.body.pop().value)
            exec(compile(tree, _FILENAME, "exec"), self.namespace)
            if last is not None:
                value = eval(compile(last, _FILENAME, "eval"), self.namespace)
                if value is not None:
                    self.display(value)
            return None
        except SystemExit as e:
            return {"name": "SystemExit", "value": str(e.code), "traceback": ""}
        except BaseException as e:
            return {"name": type(e).__name__, "value": str(e), "traceback": _user_traceback(e)}
        finally:
            for bundle in _figures_safely():
                self.events.send({"type": "result", "data": bundle})


def _figures_safely() -> list[dict[str, str]]:
    try:
        return _figures()
    except Exception:
        return []


def main() -> None:
    cmd_fd = int(os.environ.pop("SBW_KERNEL_CMD_FD"))
    evt_fd = int(os.environ.pop("SBW_KERNEL_EVT_FD"))
    for fd in (cmd_fd, evt_fd):  # processes that user code starts must not inherit them
        os.set_inheritable(fd, False)
    events = _Channel(evt_fd)
    sys.stdout = io.TextIOWrapper(
        io.FileIO(1, "w", closefd=False),
        encoding="utf-8",
        errors="backslashreplace",
        write_through=True,
    )
    sys.stderr = io.TextIOWrapper(
        io.FileIO(2, "w", closefd=False),
        encoding="utf-8",
        errors="backslashreplace",
        write_through=True,
    )
    sys.argv = [""]
    sys.path.insert(0, os.getcwd())
    kernel = Kernel(events)
    events.send({"type": "ready", "pid": os.getpid()})
    with os.fdopen(cmd_fd, "rb") as commands:
        for line in commands:
            command = json.loads(line)
            error = kernel.run(command["code"])
            for stream in (sys.stdout, sys.stderr):
                with contextlib.suppress(Exception):  # user code may have closed it
                    stream.flush()
            sentinel = command["sentinel"].encode()
            os.write(1, sentinel)
            os.write(2, sentinel)
            events.send({"type": "done", "id": command["id"], "error": error})


if __name__ == "__main__":
    main()
