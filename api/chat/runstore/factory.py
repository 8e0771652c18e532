"""Picks the run store the settings name: the one place that knows both implementations
(kept out of the package's ``__init__``, which each implementation imports)."""

from __future__ import annotations

from . import RunStore


def build_store(settings) -> RunStore:
    """The store ``settings.chat_run_store`` names."""
    if settings.chat_run_store == "redis":
        from .redis_store import RedisRunStore

        return RedisRunStore.from_settings(settings)
    from .memory import MemoryRunStore

    return MemoryRunStore()
