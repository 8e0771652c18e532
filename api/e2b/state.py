"""Where E2B sandboxes' timers and ``Idempotency-Key`` answers live: in Redis when the
chat's run store is there (``shared``: every replica sees the same), else in this API
process (``lifetimes``). Made once per app and kept on its Services, so two apps in one
process keep theirs."""

from __future__ import annotations

from .lifetimes import Answers, Idempotency, Lifetimes, Timers
from .shared import SharedAnswers, SharedTimers


def _state(services) -> tuple[Timers, Answers]:
    state = getattr(services, "e2b_state", None)
    if state is None:
        redis = getattr(services.runs.store, "redis", None)
        if redis is not None:
            prefix = services.settings.chat_redis_prefix + "e2b:"
            state = (SharedTimers(redis, prefix), SharedAnswers(redis, prefix))
        else:
            state = (Lifetimes(), Idempotency())
        services.e2b_state = state
    return state


def lifetimes(services) -> Timers:
    return _state(services)[0]


def idempotency(services) -> Answers:
    return _state(services)[1]
