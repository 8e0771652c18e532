"""Conversation ids an API caller may send that must never name a directory: refused by
the API's own routes (tests/api/test_hostile_paths.py) and, as E2B ``metadata``, by the
E2B surface (tests/api/test_e2b_hostile.py)."""

import pytest

API_HOSTILE_CONVERSATION_IDS = [
    pytest.param("..", id="dot-dot"),
    pytest.param(".", id="dot"),
    pytest.param("../c2", id="traversal"),
    pytest.param("/etc", id="absolute"),
    pytest.param("c1\x00", id="nul"),
    pytest.param("c1\n", id="newline"),
    pytest.param("a\\b", id="backslash"),
    pytest.param("\uff0e\uff0e", id="fullwidth-dot-dot"),
    pytest.param("\u2025", id="two-dot-leader"),
    pytest.param("\u202ec1", id="rtl-override"),
    pytest.param(".runtime", id="runtime-state-dir"),
    pytest.param("a" * 256, id="256-bytes"),
]
