"""Per-user caps: how many conversations a user may hold, how much one may do at once.

Contract:
- ``Quotas`` is the settings group (SANDBOX_WORKSPACE_QUOTAS__*), each cap with its
  default; a cap is per API replica for the concurrency caps (counted in this process),
  per cluster (or data directory) for conversations (counted where they are tracked).
- ``QuotaExceeded`` (409 ``quota_exceeded``) names the cap and its setting: waiting does
  not help, deleting conversations does.
- ``Concurrency(kind, cap, setting).take(key)`` takes one of ``cap`` slots of ``key``
  (the caller's session id: tenant and user) and returns its release (idempotent), or
  raises ``TooManyAtOnce`` (429 with ``Retry-After``); ``hold(key)`` is the same as a
  context manager. Counters are dropped when they reach zero, so the map holds only
  keys with something in progress (it is bounded by what is in progress, not by users).
- ``Caps(kind, per_user, per_tenant, total).take(caller)`` takes one slot of the
  caller's user (tenant and user), of its tenant and of ``total`` (a bound of the whole
  replica, maybe shared with other kinds), in that order, and returns their release
  (idempotent); at any cap it takes none and raises ``TooManyAtOnce``. So neither one
  user nor one tenant takes the replica's whole bound.
- ``UserLimits(quotas, runtime_connections)``: this process's concurrency caps per user,
  and ``runtime_streams``, the replica's one bound on calls that hold a runtime
  connection for as long as code runs (``/execute``, E2B streams): half of
  ``runtime_connections``, so every other call finds a connection in the pool.
  ``take_execution(caller)`` takes the user's ``/execute`` slot, the tenant's, then the
  replica's (``executions``, a ``Caps``; none at a cap).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from typing import Protocol

from pydantic import BaseModel, Field

from sandbox_workspace.contract.errors import ApiError, Conflict

_PREFIX = "SANDBOX_WORKSPACE_QUOTAS__"


class Quotas(BaseModel):
    """SANDBOX_WORKSPACE_QUOTAS__*: caps per user."""

    conversations_per_user: int = Field(
        1000, ge=1, description="Conversations one user may hold (then 409 quota_exceeded)."
    )
    runs_per_user: int = Field(
        8, ge=1, description="Chat/agent runs of one user in progress at once (then 429)."
    )
    followers_per_user: int = Field(
        32, ge=1, description="Event streams (SSE) one user may follow at once (then 429)."
    )
    executions_per_user: int = Field(
        32, ge=1, description="/execute calls of one user in progress at once (then 429)."
    )
    executions_per_tenant: int = Field(
        128,
        ge=1,
        description="/execute calls of all users of one tenant in progress at once on one "
        "API replica (then 429); with one tenant only, raise it to the replica's bound.",
    )
    e2b_streams_per_user: int = Field(
        32,
        ge=1,
        description="E2B streams (commands, `commands.connect`, `run_code`) one user may "
        "hold open at once on one API replica (then 429, the SDK's rate-limit error).",
    )
    e2b_streams_per_tenant: int = Field(
        128,
        ge=1,
        description="E2B streams all users of one tenant may hold open at once on one API "
        "replica (then 429).",
    )
    e2b_watchers_per_user: int = Field(
        32, ge=1, description="E2B directory watchers one user may hold on one API replica."
    )
    e2b_watchers_per_tenant: int = Field(
        128,
        ge=1,
        description="E2B directory watchers all users of one tenant may hold on one API replica.",
    )
    snapshot_bytes_per_user: int = Field(
        10 * 1024**3,
        ge=0,
        description="Bytes all of one user's conversation snapshots may hold (then 413).",
    )


class QuotaExceeded(Conflict):
    """A count cap is reached; the message names it and its setting."""

    code = "quota_exceeded"

    def __init__(self, what: str, cap: int, setting: str) -> None:
        super().__init__(
            f"{what}: the cap of {cap} is reached ({_PREFIX}{setting.upper()}); delete some first"
        )


class TooManyAtOnce(ApiError):
    """A concurrency cap is reached; retrying after ``Retry-After`` may succeed."""

    status, code = 429, "too_many_requests"
    retry_after = 1


class Concurrency:
    def __init__(self, kind: str, cap: int, setting: str, scope: str = "per user") -> None:
        self.kind = kind
        self.cap = cap
        # A quota's name (``runs_per_user``), or any other words naming what sets the cap.
        self.setting = setting if " " in setting else _PREFIX + setting.upper()
        self.scope = scope
        self._held: dict[str, int] = {}

    def held(self, key: str) -> int:
        return self._held.get(key, 0)

    def take(self, key: str) -> Callable[[], None]:
        count = self._held.get(key, 0)
        if count >= self.cap:
            raise TooManyAtOnce(
                f"{self.kind}: at most {self.cap} at once {self.scope} "
                f"({self.setting}); retry when one has finished"
            )
        self._held[key] = count + 1
        released = False

        def release() -> None:
            nonlocal released
            if released:
                return
            released = True
            left = self._held[key] - 1
            if left:
                self._held[key] = left
            else:
                del self._held[key]

        return release

    @contextlib.contextmanager
    def hold(self, key: str) -> Iterator[None]:
        release = self.take(key)
        try:
            yield
        finally:
            release()


class Who(Protocol):
    """Whose slots ``Caps`` takes (an ``identity.Caller``)."""

    @property
    def tenant(self) -> str: ...

    @property
    def user_id(self) -> str: ...


class Caps:
    """A user's, its tenant's and the replica's slots, taken together (module contract)."""

    def __init__(self, kind: str, per_user: tuple[int, str], per_tenant: tuple[int, str],
                 total: Concurrency) -> None:  # fmt: skip
        """``total``: the replica's bound (may be shared with other kinds)."""
        self.user = Concurrency(kind, *per_user)
        self.tenant = Concurrency(kind, *per_tenant, scope="per tenant")
        self.total = total

    def take(self, caller: Who) -> Callable[[], None]:
        releases: list[Callable[[], None]] = []
        try:
            releases.append(self.user.take(json.dumps([caller.tenant, caller.user_id])))
            releases.append(self.tenant.take(caller.tenant))
            releases.append(self.total.take(""))
        except TooManyAtOnce:
            for release in releases:
                release()
            raise

        def release_all() -> None:
            for release in releases:
                release()

        return release_all


RUNTIME_STREAMS_SETTING = "half of SANDBOX_WORKSPACE_RUNTIME_CONNECTIONS"


class UserLimits:
    def __init__(self, quotas: Quotas, runtime_connections: int = 512) -> None:
        self.quotas = quotas
        self.runtime_streams = Concurrency(
            "calls holding a runtime connection (executions, E2B streams)",
            runtime_connections // 2,
            RUNTIME_STREAMS_SETTING,
            scope="on this API replica",
        )
        self.runs = Concurrency("runs", quotas.runs_per_user, "runs_per_user")
        self.followers = Concurrency(
            "event streams", quotas.followers_per_user, "followers_per_user"
        )
        # One bound with E2B streams (``e2b.admission``): together at most half the pool.
        self.executions = Caps(
            "executions",
            (quotas.executions_per_user, "executions_per_user"),
            (quotas.executions_per_tenant, "executions_per_tenant"),
            self.runtime_streams,
        )

    def take_execution(self, caller: Who) -> Callable[[], None]:
        """An ``/execute`` slot of the caller, its tenant and the replica; their release."""
        return self.executions.take(caller)
