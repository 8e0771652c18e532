"""Executed code is confined to its conversation: the hostile catalogue through the API."""

from __future__ import annotations

from hostile_code import run_hostile_suite


def test_hostile_code_is_refused_and_the_sandbox_stays_healthy(api, session_url):
    run_hostile_suite(api, session_url)
