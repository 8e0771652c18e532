"""The documentation (README.md and docs/*.md) stays true and connected.

Each test reads the facts where they live and compares them with their source: links and
anchors with the files and headings they name, the configuration table with the settings
classes, the metrics table with the metrics the code defines, the hostile catalogue's list
with the catalogue, the performance page with the benchmark suites and result files. The
walk-through (tests/api/test_readme.py), the API operations table (tests/api/test_openapi.py)
and the install blocks (tests/node) are run or compared by their own tests; here only their
markers are checked, so a moved block fails fast on every machine.
"""

from __future__ import annotations

import ast
import itertools
import re
from pathlib import Path

import pytest
from doc_blocks import OPERATIONS, README, REPO_ROOT, shell_block
from metric_names import metrics_in_code
from pydantic import BaseModel
from pydantic_settings import BaseSettings

from sandbox_workspace.api.settings import ApiSettings
from sandbox_workspace.operator.settings import OperatorSettings
from sandbox_workspace.runtime.settings import RuntimeSettings

DOCS = REPO_ROOT / "docs"
PAGES = [README, *sorted(DOCS.glob("*.md"))]
SECURITY = DOCS / "security.md"
PERFORMANCE = DOCS / "performance.md"


def prose(text: str) -> str:
    """The text without fenced code blocks and inline code spans (where links are not links)."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", text)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for heading in re.findall(r"^#{1,6} (.+)$", prose_keep_headings(page), re.M):
        base = slug(heading)
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def prose_keep_headings(page: Path) -> str:
    """The page without fenced code blocks (a '# comment' in a shell block is no heading)."""
    return re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M)


def section(page: Path, heading: str) -> str:
    """The text under `## heading` up to the next heading of level 2."""
    text = page.read_text()
    assert f"\n## {heading}\n" in text, f"{page.name} lost its section {heading!r}"
    return text.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]


LINKS = [
    pytest.param(page, target, id=f"{page.name}->{target}")
    for page in PAGES
    for target in re.findall(r"\]\(([^)\s]+)\)", prose(page.read_text()))
    if not re.match(r"[a-z]+:", target)
]


@pytest.mark.parametrize(("page", "target"), LINKS)
def test_relative_link_resolves(page: Path, target: str):
    path, _, anchor = target.partition("#")
    dest = (page.parent / path).resolve() if path else page
    assert dest.exists(), f"{page.name} links to {target}: no such file"
    if anchor:
        assert dest.suffix == ".md", f"{page.name} links to an anchor in {dest.name}"
        assert anchor in anchors(dest), (
            f"{page.name} links to {target}: {dest.name} has no heading with that anchor "
            f"(it has {sorted(anchors(dest))})"
        )


def test_readme_is_short_and_maps_every_page():
    assert len(LINKS) > 20, "the link check found next to no links: is its pattern broken?"
    text = README.read_text()
    assert text.count("\n") <= 250, "README.md is over 250 lines: move sections to docs/"
    for page in DOCS.glob("*.md"):
        assert f"](docs/{page.name})" in text, f"README's map of docs/ lacks {page.name}"


@pytest.mark.parametrize("page", sorted(DOCS.glob("*.md")), ids=lambda p: p.name)
def test_page_opens_with_whom_it_is_for(page: Path):
    lines = page.read_text().splitlines()
    assert lines[0].startswith("# ")
    first = next(line for line in lines[1:] if line.strip())
    assert first.startswith("*For "), f"{page.name} should open with whom it is for"


@pytest.mark.parametrize(
    ("doc", "name"),
    [(README, "walkthrough"), (OPERATIONS, "install"), (OPERATIONS, "install-walkthrough")],
    ids=["README-walkthrough", "operations-install", "operations-install-walkthrough"],
)
def test_shell_blocks_are_where_their_tests_read_them(doc: Path, name: str):
    assert shell_block(doc, name).strip()


def test_the_web_page_screenshot_is_shown_where_the_page_is_described():
    text = README.read_text()
    assert "](docs/web-ui.png)" in section(README, "Try it")
    assert text.count("docs/web-ui.png") == 1


# --------------------------------------------------------------------------- settings


def env_names(settings: type[BaseSettings]) -> set[str]:
    """Every environment variable a settings class reads (nested models with `__`)."""
    prefix = settings.model_config["env_prefix"]
    delimiter = settings.model_config.get("env_nested_delimiter") or None

    def walk(model: type[BaseModel], path: str) -> set[str]:
        names = set()
        for field, info in model.model_fields.items():
            name = f"{path}{field.upper()}"
            nested = [
                t
                for t in (info.annotation, *getattr(info.annotation, "__args__", ()))
                if isinstance(t, type) and issubclass(t, BaseModel)
            ]
            if nested and delimiter:
                names |= walk(nested[0], f"{name}{delimiter}")
            else:
                names.add(name)
        return names

    return walk(settings, prefix)


def braces(name: str) -> list[str]:
    """`A_{X,Y}__{P,Q}` → every combination (the table's shorthand for nested keys)."""
    parts = re.split(r"\{([^}]*)\}", name)
    choices = [[p] if i % 2 == 0 else p.split(",") for i, p in enumerate(parts)]
    return ["".join(c) for c in itertools.product(*choices)]


def documented_settings() -> set[str]:
    rows = re.findall(r"^\| (`SANDBOX_[^|]*) \|", section(OPERATIONS, "Configuration"), re.M)
    names = {n for row in rows for code in re.findall(r"`([^`]+)`", row) for n in braces(code)}
    assert names, "docs/operations.md's configuration table has no rows"
    return names


# Read with os.environ by the code rather than through a settings class.
ENVIRONMENT_ONLY = {
    "SANDBOX_WORKSPACE_LOG_FORMAT",  # sandbox_workspace/logs.py, every process
    "SANDBOX_RUNTIME_LOG_LEVEL",  # sandbox_workspace/cli.py, the runtime's --log-level
}


def test_configuration_table_lists_every_setting_and_only_settings():
    in_code = set().union(*map(env_names, (ApiSettings, RuntimeSettings, OperatorSettings)))
    for name in ENVIRONMENT_ONLY:
        owner = "logs.py" if name.endswith("FORMAT") else "cli.py"
        assert name in (REPO_ROOT / "sandbox_workspace" / owner).read_text()
    in_code |= ENVIRONMENT_ONLY
    documented = documented_settings()
    assert not in_code - documented, f"settings missing from the table: {in_code - documented}"
    assert not documented - in_code, f"the table names no setting: {documented - in_code}"


# --------------------------------------------------------------------------- metrics


def test_metrics_table_lists_every_metric_and_only_metrics():
    in_code = metrics_in_code()
    assert {"sandbox_api_requests_total", "sandbox_operator_errors_total"} <= in_code
    table = section(OPERATIONS, "Metrics and what to alert on")
    documented = set(re.findall(r"^\| `(sandbox_\w+)` \|", table, re.M))
    assert not in_code - documented, f"metrics missing from the table: {in_code - documented}"
    assert not documented - in_code, f"the table names no metric: {documented - in_code}"


# --------------------------------------------------------------------------- security


def test_hostile_catalogue_list_equals_the_catalogue():
    from hostile_code import ATTACKS

    listed = re.findall(r"^- `(.+)`$", section(SECURITY, "The hostile catalogue"), re.M)
    assert listed == [attack.name for attack in ATTACKS]


# --------------------------------------------------------------------------- performance


def test_performance_page_describes_every_suite_and_result_file():
    main = ast.parse((REPO_ROOT / "bench" / "__main__.py").read_text())
    (suites,) = [
        ast.literal_eval(node.value)
        for node in main.body
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "SUITES"
    ]
    assert "session_start" in suites
    text = PERFORMANCE.read_text()
    for suite in suites:
        assert f"bench/{suite}.py" in text or f"bench {suite}" in text, suite
    for result in sorted((REPO_ROOT / "bench" / "results").glob("*.json")):
        # Untracked: quick runs' files and the summaries (latest.json, and the test
        # command's latest-quick-<unit>.json).
        tracked = not result.name.endswith("-quick.json") and not result.name.startswith("latest")
        if tracked:
            assert f"bench/results/{result.name}" in text or f"`{result.name}`" in text, result
