"""Schemathesis hooks of the contract test (loaded with SCHEMATHESIS_HOOKS).

The API documents ids and file names with a pattern plus ``format: sandbox-name``
(``api.names``): the pattern states every rule a portable regex can, the format stands for
the whole rule — including the two a pattern cannot state (255 bytes in UTF-8, invisible
characters outside the BMP). Here the format gets its strategy: any text the server's own
``check_name`` accepts, drawn from all of Unicode, so positive cases test the real rule.
"""

from __future__ import annotations

import re

import schemathesis
from hypothesis import strategies as st

from sandbox_workspace.api.names import NAME_FORMAT, NAME_PATTERN
from sandbox_workspace.runtime import pathsafe

_PATTERN = re.compile(NAME_PATTERN)


def _accepted(name: str) -> bool:
    try:
        return pathsafe.check_name(name) == name and bool(_PATTERN.match(name))
    except pathsafe.UnsafePath:
        return False


# No surrogates: a URL or JSON text carries code points, not UTF-16 halves.
_NAMES = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=80).filter(
    _accepted
)

schemathesis.openapi.format(NAME_FORMAT, _NAMES)
