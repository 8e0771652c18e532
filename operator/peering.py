"""Whether this replica is the active one (kopf peering), for work kopf does not gate.

kopf pauses a standby replica's handlers itself (its watches stop while a peer with a
higher priority is alive), but not our own scheduler of session deadlines
(``deadlines.py``), which was fed while the replica was active. Before acting on a
deadline, ``Activity.active()`` answers whether this replica would be running by kopf's
own rule (``kopf._core.engines.peering.process_peering_event``): no live peer in the
``KopfPeering`` object with a higher priority, and none with the same. A standalone
operator is always active. The object is read at most once per ``ttl`` seconds (a burst
of due sessions costs one read); an unreadable one counts as not active (a standby that
acts twice is worse than a deadline a little late).
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any

from sandbox_workspace.kube import KubeError

PEERING_GROUP = "kopf.dev/v1"


def is_active(status: dict[str, Any], identity: str, priority: int, at: datetime) -> bool:
    """kopf's rule, on the peering object's ``status`` (peer id → record)."""
    for peer, record in (status or {}).items():
        if peer == identity or not isinstance(record, dict):
            continue
        try:
            seen = datetime.fromisoformat(str(record["lastseen"]).replace("Z", "+00:00"))
            lifetime = timedelta(seconds=int(record.get("lifetime", 60)))
        except (KeyError, ValueError, TypeError):
            continue
        if seen.tzinfo is None:
            seen = seen.replace(tzinfo=UTC)
        if seen + lifetime <= at:
            continue  # dead
        if int(record.get("priority", 0)) >= priority:
            return False
    return True


class Activity:
    def __init__(
        self,
        kube: Any,
        *,
        standalone: bool,
        clusterwide: bool,
        name: str,
        identity: str,
        priority: int,
        ttl: float = 1.0,
    ) -> None:
        self.kube, self.standalone, self.clusterwide, self.name = (
            kube,
            standalone,
            clusterwide,
            name,
        )
        self.identity, self.priority, self.ttl = identity, priority, ttl
        self._answers: dict[str, tuple[float, bool]] = {}

    def _path(self, namespace: str) -> str:
        if self.clusterwide:
            return f"/apis/{PEERING_GROUP}/clusterkopfpeerings/{self.name}"
        return f"/apis/{PEERING_GROUP}/namespaces/{namespace}/kopfpeerings/{self.name}"

    async def active(self, namespace: str) -> bool:
        """Whether this replica handles ``namespace`` now (see the module contract)."""
        if self.standalone:
            return True
        path = self._path(namespace)
        now = time.monotonic()
        cached = self._answers.get(path)
        if cached is not None and now - cached[0] < self.ttl:
            return cached[1]
        try:
            body = await self.kube.get(path)
        except KubeError:
            body = None
        answer = body is not None and is_active(
            body.get("status") or {}, self.identity, self.priority, datetime.now(UTC)
        )
        self._answers[path] = (now, answer)
        return answer
