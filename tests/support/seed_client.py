"""Seed 000 §3.2's EnsureSandboxSession, ported literally from its Go (same order, same
retry bounds), as a platform team's DAP would run it against this API.

GetSession → 404: create; other error: create; ``running``: reuse; any other status:
"recreate" (create). createNewSession: POST; an "already exists" error (409) waits for
the existing session; any other error fails. waitForSessionReady: ``MAX_RETRIES`` GETs
``RETRY_INTERVAL`` apart; ``running`` succeeds, ``error`` or ``stopped`` fails at once, a
failed GET is retried. Each GET the flow made is kept in ``seen`` (the statuses a client
would have observed), so tests can assert "never ``stopped`` after the POST".
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx

# seed 000 §5.1: max_retries 30, retry_interval 500ms.
MAX_RETRIES = 30
RETRY_INTERVAL = 0.5


class SeedError(Exception):
    """The seed's ``errors.Errorf``/``errors.New`` results."""


@dataclass
class SeedClient:
    client: httpx.Client
    user_id: str
    agent_id: str = "agent-seed"
    business_domain_id: str = "bd-seed"
    prefix: str = "/api/v1"  # where the client's base URL leaves the API's paths
    seen: list[str] = field(default_factory=list)  # statuses of every GET, in order
    actions: list[str] = field(default_factory=list)  # the span's "action" values
    created: list[int] = field(default_factory=list)  # status codes of its POSTs
    # Called just before the POST (tests line concurrent clients up there); no effect.
    before_create: Callable[[], object] | None = None

    def _get(self, session_id: str) -> dict:
        r = self.client.get(f"{self.prefix}/sessions/{session_id}")
        if r.status_code == 404:
            raise LookupError(session_id)
        r.raise_for_status()
        body = r.json()
        self.seen.append(body["status"])
        return body

    def ensure(self, session_id: str) -> str:
        try:
            info = self._get(session_id)
        except LookupError:
            self.actions.append("create_new")
            return self._create_new(session_id)
        except httpx.HTTPError:
            self.actions.append("recover_from_error")
            return self._create_new(session_id)
        if info["status"] == "running":
            self.actions.append("reuse_existing")
            return session_id
        self.actions.append("recreate")
        return self._create_new(session_id)

    def _create_new(self, session_id: str) -> str:
        if self.before_create is not None:
            self.before_create()
        r = self.client.post(
            f"{self.prefix}/sessions",
            json={
                "user_id": self.user_id,
                "agent_id": self.agent_id,
                "business_domain_id": self.business_domain_id,
                "config": {
                    "session_id": session_id,
                    "file_upload_config": {
                        "max_file_size": 100,
                        "max_file_size_unit": "MB",
                        "max_file_count": 50,
                        "allowed_file_types": ["csv", "txt"],
                    },
                },
            },
        )
        self.created.append(r.status_code)
        if r.status_code == 409:  # isSessionAlreadyExistsError: wait for the existing one
            return self._wait_ready(session_id)
        if r.status_code >= 400:
            raise SeedError(f"create sandbox session failed: {r.status_code} {r.text}")
        return self._wait_ready(r.json().get("session_id") or session_id)

    def _wait_ready(self, session_id: str) -> str:
        for _ in range(MAX_RETRIES):
            try:
                info = self._get(session_id)
            except (LookupError, httpx.HTTPError):
                time.sleep(RETRY_INTERVAL)
                continue
            if info["status"] == "running":
                return session_id
            if info["status"] in ("error", "stopped"):
                raise SeedError(f"session in invalid state: {info['status']}")
            time.sleep(RETRY_INTERVAL)
        raise SeedError("timeout waiting for session ready")


def assert_recovered(seed: SeedClient, first: str) -> None:
    """The flow of a session that was down: ``first`` seen, one create answered 409, and
    from then on never a state the seed's client fails on, until ``running``."""
    assert seed.seen[0] == first, seed.seen
    assert seed.actions == ["recreate"] and seed.created == [409]
    assert not {"stopped", "error"} & set(seed.seen[1:]), seed.seen
    assert seed.seen[-1] == "running"
