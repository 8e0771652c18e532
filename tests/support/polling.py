"""Tests poll with a deadline, never sleep for luck."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(predicate: Callable[[], T], what: str, timeout: float = 20.0) -> T:
    """``predicate()`` once it is truthy; fails naming ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)
    return value
