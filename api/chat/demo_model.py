"""A scripted demo model, so chat can be tried on ``make dev`` with no model service.

It says plainly that it is one, and it drives the product's own tools on the user's own
files: the runs, streams, tool steps, approvals and outputs it produces are the real ones;
only the "thinking" is a script. The API uses it only in dev mode with no model configured
(``ApiSettings.demo_model``, refused with ``auth_mode=required``).

Contract: ``DemoModel.stream(messages, tools)`` is the ``LlmClient`` interface (text pieces,
then one ``Completion``), decided from the conversation since the last user message:
1. no tool called yet: a sentence saying it is the demo model, then ``list_files``;
2. after the listing: with a CSV upload (a selected one first, else the first listed),
   ``execute_code`` that prints its rows, columns and the numeric columns' means and saves
   a chart to ``outputs/demo_chart.png``; with none, an answer saying how to upload one;
3. after the code wrote the chart: ``present_file`` on it;
4. then an answer quoting what the code printed (or what the tool answered, e.g. a
   rejected approval).
A tool the run does not offer (a ``deny`` policy) is skipped to the next step.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator

from .context import CONTEXT_HEADER
from .llm import Completion, ToolCall

NAME = "demo (scripted, not a language model)"
CHART = "outputs/demo_chart.png"
INTRO = (
    "I am the demo model of `make dev`: a script, not a language model, showing what a "
    "real model does with this sandbox. Configure one with SANDBOX_WORKSPACE_LLM_MODEL "
    "and SANDBOX_WORKSPACE_LLM_BASE_URL. First, the files of this conversation:"
)
_LISTED = re.compile(r"^- (?P<name>.+?) \((?P<path>[^,()]+), \d+ bytes\)$", re.M)
_SELECTED = re.compile(r"^- (?P<name>.+?) \((?P<path>[^()]+)\)$", re.M)

_CODE = """\
import os
import pandas as pd
df = pd.read_csv({path!r})
print(f"{{len(df)}} rows, {{len(df.columns)}} columns: {{', '.join(map(str, df.columns))}}")
numbers = df.select_dtypes("number")
if not numbers.empty:
    print("means:")
    print(numbers.mean().round(3).to_string())
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    os.makedirs("outputs", exist_ok=True)
    numbers.head(30).plot(kind="bar", figsize=(6, 3.5), title={name!r})
    plt.tight_layout()
    plt.savefig({chart!r})
    plt.close("all")
    print("chart: {chart}")
"""


def _since_last_question(messages: list[dict]) -> list[dict]:
    last = max(
        (
            i
            for i, m in enumerate(messages)
            if m["role"] == "user" and not str(m.get("content", "")).startswith(CONTEXT_HEADER)
        ),
        default=0,
    )
    return messages[last + 1 :]


def _results(turn: list[dict]) -> dict[str, str]:
    """Tool name → the content of its result, for the calls made since the question."""
    names = {
        call["id"]: call["function"]["name"]
        for m in turn
        if m["role"] == "assistant"
        for call in m.get("tool_calls") or []
    }
    return {
        names[m["tool_call_id"]]: str(m.get("content", ""))
        for m in turn
        if m["role"] == "tool" and m.get("tool_call_id") in names
    }


def _csv(messages: list[dict], listing: str) -> tuple[str, str] | None:
    """(name, path) of the CSV to look at: a selected one first, else the first upload."""
    selected = [
        (m["name"], m["path"])
        for message in messages
        if message["role"] == "user" and str(message.get("content", "")).startswith(CONTEXT_HEADER)
        for m in _SELECTED.finditer(str(message["content"]))
    ]
    uploads = listing.split("Outputs:", 1)[0]
    listed = [(m["name"], m["path"]) for m in _LISTED.finditer(uploads)]
    return next(((n, p) for n, p in selected + listed if n.lower().endswith(".csv")), None)


def decide(messages: list[dict], offered: set[str]) -> tuple[str, ToolCall | None]:
    """The next reply: its text, and the tool call it makes (None: the final answer)."""
    done = _results(_since_last_question(messages))
    if not done and "list_files" in offered:
        return INTRO, _call("list_files", {})
    if "execute_code" not in done and "execute_code" in offered:
        found = _csv(messages, done.get("list_files", ""))
        if found is None:
            return (
                "This conversation has no CSV file yet. Upload one (the web page's upload, "
                "or POST /api/v1/sessions/{session_id}/files/upload) and ask again: I will "
                "load it with pandas, summarise it and chart its numbers.",
                None,
            )
        name, path = found
        code = _CODE.format(path=path, name=name, chart=CHART)
        return f"Now I run Python on {name} in the sandbox:", _call("execute_code", {"code": code})
    ran = done.get("execute_code", "")
    if f"chart: {CHART}" in ran and "present_file" not in done and "present_file" in offered:
        return "The code drew a chart; I offer it for download:", _call(
            "present_file", {"path": CHART}
        )
    if not ran:
        return "(demo model) No tool ran; there is nothing to report.", None
    return f"(demo model) Here is what the code answered:\n\n```\n{ran.strip()}\n```", None


def _call(name: str, arguments: dict) -> ToolCall:
    return ToolCall(id=f"demo_{name}", name=name, arguments=json.dumps(arguments))


class DemoModel:
    """The ``LlmClient`` interface over ``decide``: no network, nothing to close."""

    model = NAME

    async def stream(
        self, messages: list[dict], tools: list[dict]
    ) -> AsyncIterator[str | Completion]:
        offered = {t["function"]["name"] for t in tools}
        text, call = decide(messages, offered)
        for word in re.findall(r"\S+\s*|\s+", text):  # word-sized pieces, as models stream
            yield word
        yield Completion(
            content=text,
            tool_calls=[call] if call else [],
            finish_reason="tool_calls" if call else "stop",
        )

    async def aclose(self) -> None:
        return None
