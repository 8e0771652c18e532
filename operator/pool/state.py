"""What one operator knows of its warm pools: free ready pods, claim keys, metrics.

Contract: in memory only, fed by the pool pods' watch events (``refill.on_pool_pod_event``)
and by the refiller's listings (``counts`` is what the SandboxPool resource reports;
``changed`` is set whenever they may have moved) — a hint, never the truth: a claim is
decided by the apiserver (``spec.claim_patch``), so a stale entry costs one 409, not a shared pod.
``take`` hands each free pod to at most one caller of this process at a time;
``claim_settled`` waits for that caller's claim of it (swap and token delivery) to end.
``starting`` counts the free pods created or seen that are not ready yet (the refiller's
own creations from their answers, the rest from the watch), so a refill round needs no
listing; ``relist`` asks the next round for one (at start, after a failed or outdated
pod, and as the refiller's periodic resync).
``wake_after_claim`` wakes the refiller and notes the claim's time: the refiller waits for
the claims to settle before it starts pods (``refill.settle``).
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from sandbox_workspace.kube import Kube


class PoolMetrics:
    """``sandbox_operator_pool_ready{namespace}``: free pods whose runtime is ready;
    ``sandbox_operator_pool_claimed{namespace}``: live pods claimed from the pool;
    ``sandbox_operator_pool_starts_total{namespace, source}``: session starts by source
    (``pool``, or ``cold_<reason>``: ``cold_empty``, ``cold_spec``, ``cold_conflict``...);
    ``sandbox_operator_pool_claim_seconds``: first claim attempt to token delivered;
    ``sandbox_operator_pool_refills_total{namespace}``: pool pods created."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.ready = Gauge(
            "sandbox_operator_pool_ready",
            "Free pool pods whose runtime is ready.",
            ["namespace"],
            registry=registry,
        )
        self.claimed = Gauge(
            "sandbox_operator_pool_claimed",
            "Live sandbox pods that were claimed from the pool.",
            ["namespace"],
            registry=registry,
        )
        self.starts = Counter(
            "sandbox_operator_pool_starts",
            "Session pod starts by source: pool, or cold and why.",
            ["namespace", "source"],
            registry=registry,
        )
        self.claim_seconds = Histogram(
            "sandbox_operator_pool_claim_seconds",
            "From a session's first claim attempt to its token delivered to the pod.",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
            registry=registry,
        )
        self.refills = Counter(
            "sandbox_operator_pool_refills",
            "Pool pods created.",
            ["namespace"],
            registry=registry,
        )


# Claims' workspace paths kept at once (``PoolState.keep_workspace_path``): each is taken
# by its status write a moment after the claim; more are ones whose pod's deletion the
# watch missed.
WORKSPACE_PATHS_MAX = 1024


@dataclass
class PoolState:
    """Per namespace: free ready pods (name → pod as last seen) and claimed pod names."""

    namespaces: tuple[str, ...]
    size: int
    metrics: PoolMetrics
    free: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    claimed: dict[str, set[str]] = field(default_factory=dict)
    starting: dict[str, set[str]] = field(default_factory=dict)  # free, not ready yet
    relist: bool = True  # the next refill round lists the pool's pods
    keys: dict[str, str] = field(default_factory=dict)  # namespace → claim key
    delivered: set[str] = field(default_factory=set)  # pod uids whose claim answered 200
    # Pod uid → the workspace path its claim's answer named, until the status records it
    # (``take_workspace_path``) or the pod goes; at most ``WORKSPACE_PATHS_MAX``.
    workspace_paths: dict[str, str] = field(default_factory=dict)
    # Pod uid → set when this process's claim of it ends (swap sent, token on its way).
    claiming: dict[str, asyncio.Event] = field(default_factory=dict)
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    changed: asyncio.Event = field(default_factory=asyncio.Event)  # a count moved: report
    task: asyncio.Task | None = None
    reporter: asyncio.Task | None = None
    api: Kube | None = None  # the claims' own apiserver client (claim.claims_api)
    short_starts: int = 0  # starts by the short path (handlers/pool_start.py)
    # New sessions the short path started whose kopf creation handler has not returned
    # yet: kopf stores no diff base for them (``operator/diffbase.py``, ``unrecorded``).
    started_new: set[str] = field(default_factory=set)
    posting: set[asyncio.Task] = field(default_factory=set)  # Events waiting for settle
    last_claim: float = 0.0  # time.monotonic() of the latest swap or status written

    def keep_workspace_path(self, uid: str, path: str) -> None:
        """The path the claim of pod ``uid`` was answered with, for its status write. An
        entry leaves with that write or the pod's deletion event — not with a deletion
        the watch missed (a re-list after a gap tells none): past the bound the oldest go
        (their status long written; at worst the API asks the runtime itself)."""
        self.workspace_paths.pop(uid, None)
        while len(self.workspace_paths) >= WORKSPACE_PATHS_MAX:
            del self.workspace_paths[next(iter(self.workspace_paths))]
        self.workspace_paths[uid] = path

    def take_workspace_path(self, uid: str) -> str | None:
        """The workspace path the claim of pod ``uid`` was answered with, once."""
        return self.workspace_paths.pop(uid, None)

    def counts(self, namespace: str) -> tuple[int, int]:
        """(free ready pods, live claimed pods) of ``namespace``."""
        return len(self.free.get(namespace, {})), len(self.claimed.get(namespace, ()))

    def serves(self, namespace: str) -> bool:
        return self.size > 0 and namespace in self.namespaces

    def note_starting(self, namespace: str, name: str, starting: bool) -> None:
        names = self.starting.setdefault(namespace, set())
        (names.add if starting else names.discard)(name)

    def note_free(self, namespace: str, pod: dict[str, Any], ready: bool) -> bool:
        """True when the pod has just become a free ready one."""
        name = pod["metadata"]["name"]
        if ready:
            self.note_starting(namespace, name, False)
        pods = self.free.setdefault(namespace, {})
        new = ready and name not in pods
        if ready:
            pods[name] = pod
        else:
            pods.pop(name, None)
        self.metrics.ready.labels(namespace).set(len(pods))
        self.changed.set()
        return new

    def note_claimed(self, namespace: str, name: str, live: bool) -> None:
        names = self.claimed.setdefault(namespace, set())
        (names.add if live else names.discard)(name)
        self.free.get(namespace, {}).pop(name, None)
        self.note_starting(namespace, name, False)
        self.metrics.claimed.labels(namespace).set(len(names))
        self.metrics.ready.labels(namespace).set(len(self.free.get(namespace, {})))
        self.changed.set()

    def started(self, uid: str) -> bool:
        """Whether ``uid`` is a new session the short path started (``started_new``)."""
        return uid in self.started_new

    def unrecorded(self, uid: str) -> bool:
        """True once for a new session the short path started (``started_new``): its kopf
        creation handler's diff base is not written (``operator/diffbase.py``)."""
        if uid in self.started_new:
            self.started_new.discard(uid)
            return True
        return False

    def note_written(self) -> None:
        """A start's status is written: its claim has settled from then (``last_claim``)."""
        self.last_claim = time.monotonic()

    def wake_after_claim(self) -> None:
        self.last_claim = time.monotonic()
        self.wake.set()

    def begin_claim(self, uid: str) -> None:
        self.claiming[uid] = asyncio.Event()

    def end_claim(self, uid: str) -> None:
        done = self.claiming.pop(uid, None)
        if done is not None:
            done.set()

    async def claim_settled(self, uid: str) -> None:
        """Return once no claim of pod ``uid`` is in flight in this process: a pod's watch
        event waits for it, then finds the swap's version known (nothing to reconcile) and
        the token delivered (nothing to deliver again) — otherwise, in a burst, the event
        often overtook the swap's answer and did both a second time."""
        done = self.claiming.get(uid)
        if done is not None:
            await done.wait()

    def take(self, namespace: str) -> dict[str, Any] | None:
        """A free ready pod, removed from the hint (random: racing operators spread)."""
        pods = self.free.get(namespace) or {}
        if not pods:
            return None
        pod = pods.pop(random.choice(list(pods)))
        self.metrics.ready.labels(namespace).set(len(pods))
        self.changed.set()
        return pod
