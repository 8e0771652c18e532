"""Check that moving README text into docs/ lost nothing and copied nothing.

    .venv/bin/python scripts/docs_moved.py REV [OLD_FILE] [--added-since BASE]

Compares OLD_FILE (default README.md) as it is at git revision REV with README.md and
docs/*.md as they are in the working tree: every non-trivial line of the old file (its
text with the indentation stripped) must occur in the new files together exactly as many
times as it occurred in the old one. Headings may move and change level (only their text
is compared, and a renamed heading is reported, not failed). Lines that were reworded on
purpose show up as "missing": read them, and check that their facts are where they went.
Exit status 1 when a line is missing or duplicated.

With ``--added-since BASE`` only the lines REV added to OLD_FILE since BASE are checked —
to place a branch's new README sections on docs/ pages after merging it:
``scripts/docs_moved.py BRANCH --added-since $(git merge-base main BRANCH)``.

Written for the README split of issue 26; useful again whenever a README section is moved
into docs/ (e.g. a branch's new README section placed on its docs/ page).
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def meaningful(line: str) -> str | None:
    """The line's text to compare, or None for lines that carry no fact of their own."""
    text = line.strip()
    if not text or text.startswith("```") or re.fullmatch(r"\|[-| :]*\|", text):
        return None
    if text.startswith("<!--") and text.endswith("-->"):
        return text
    return text if len(text) > 3 else None


def heading(text: str) -> str | None:
    match = re.match(r"#{1,6} (.*)", text)
    return match.group(1).strip() if match else None


def show(rev: str, path: str) -> str:
    return subprocess.run(
        ["git", "show", f"{rev}:{path}"], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout


def facts(text: str) -> tuple[Counter[str], list[str]]:
    """The text's lines to look for, and its headings (only their titles are compared)."""
    in_code = False
    lines: Counter[str] = Counter()
    headings = []
    for line in text.splitlines():
        if line.strip().startswith("```"):
            in_code = not in_code
        text = meaningful(line)
        if text is None:
            continue
        # Comment lines of shell blocks start with '#' too: they are not headings.
        if not in_code and heading(text) is not None:
            headings.append(heading(text))
        else:
            lines[text] += 1
    return lines, headings


def main() -> int:
    args = sys.argv[1:]
    base = None
    if "--added-since" in args:
        at = args.index("--added-since")
        base = args[at + 1]
        del args[at : at + 2]
    rev = args[0]
    old_file = args[1] if len(args) > 1 else "README.md"
    new_files = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    new_lines = [line for f in new_files for line in f.read_text().splitlines()]

    old, headings = facts(show(rev, old_file))
    new = Counter(t for t in map(meaningful, new_lines) if t is not None)
    if base is not None:
        base_lines, base_headings = facts(show(base, old_file))
        # A line the branch added is expected as often as the branch has it in all.
        old = Counter({text: old[text] for text in old - base_lines})
        headings = [h for h in headings if h not in base_headings]
    for title in headings:
        if not any(title in line for line in new_lines):
            print(f"heading renamed or dropped: {title}")

    missing = [(t, n, new[t]) for t, n in old.items() if new[t] < n]
    duplicated = [(t, n, new[t]) for t, n in old.items() if new[t] > n]
    for text, was, now in missing:
        print(f"missing ({was} → {now}): {text}")
    for text, was, now in duplicated:
        print(f"duplicated ({was} → {now}): {text}")
    total = sum(old.values())
    print(f"{total} lines checked: {len(missing)} missing, {len(duplicated)} duplicated")
    return 1 if missing or duplicated else 0


if __name__ == "__main__":
    sys.exit(main())
