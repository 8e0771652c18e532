"""Shell blocks of the documentation that tests run as written (test helper).

A block is a ```` ```sh ```` fence between ``<!-- NAME:start -->`` and ``<!-- NAME:end -->``
in a Markdown file: the README's ``walkthrough``, docs/operations.md's ``install`` and
``install-walkthrough``. Tests read them from there, so the documented commands are the
ones tested, never a copy.
"""

from __future__ import annotations

import re
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
README = REPO_ROOT / "README.md"
OPERATIONS = REPO_ROOT / "docs" / "operations.md"


def shell_block(doc: Path, name: str) -> str:
    """The shell block marked NAME in DOC; fails naming the file when the markers are gone."""
    text = doc.read_text()
    block = re.search(rf"<!-- {name}:start -->\s*```sh\n(.*?)```\s*<!-- {name}:end -->", text, re.S)
    assert block, f"{doc.relative_to(REPO_ROOT)} lost its {name} markers"
    return block.group(1)
