"""The fork/delete trial of ``bench.faults`` (store phase, issue 38 item 4): forks and
snapshots are made while origins and forks are deleted — and, in one variant, while the
API is killed — and afterwards every conversation the trial touched is checked.

While the trial's DELETE of its conversation (the origin) is under way, a forker thread
makes up to ``FORKS`` forks, 2 in --quick (each of the origin or of a fork already made),
with a snapshot after each, and the injector deletes a fork made meanwhile
(``delete_a_fork``) or kills the API (``fault_injection.kill_api``). Then, for every
fork the trial asked for (``settle``):
- one being deleted is waited for; one gone must have left 0 objects under its prefix
  (``leaked_objects``);
- one that exists is live: every object its metadata's active records name and every
  object its snapshots' records name must be in the bucket (``lost_objects``: what a
  live conversation still references and lost — to a deleted origin's cleanup, say);
  one whose fork request failed or got no answer is a ``partial_forks`` (a conversation
  the caller was never told of); each is then deleted and must leave 0 objects.
The origin's own objects are counted by ``bench.faults`` as in every trial.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx

from sandbox_workspace.operator import naming
from sandbox_workspace.store import S3Store
from sandbox_workspace.store.layout import DEFAULT_TENANT, Layout, Scope
from sandbox_workspace.store.metadata import Metadata
from sandbox_workspace.store.snapshots import StoreCopies

from .fault_injection import Fault, Trial, background, kill_api

FORKS = 4  # per trial (2 in --quick): each fork of 4 files takes ~0.1–0.3 s, and its
# deletion at the end up to a second
DEADLINE = 60.0  # for a fork's deletion, as for the trial's own


def _conversations(trial: Trial) -> str:
    return f"/api/v1/sessions/sb-session-{trial.user}/conversations"


def _fork(world: Any, trial: Trial, source: str, to: str) -> int | str:
    """``POST …/fork`` as a careful client sends it: sent again, the same, while it gets
    no answer (the API killed under it) or a 5xx, for up to a minute; its last answer
    (a status, or the error's name)."""
    deadline = time.monotonic() + DEADLINE
    while True:
        try:
            r = world.client(trial.user).post(
                f"{_conversations(trial)}/{source}/fork", json={"conversation_id": to}
            )
            if r.status_code < 500 or time.monotonic() > deadline:
                return r.status_code
        except httpx.HTTPError as e:
            if time.monotonic() > deadline:
                return type(e).__name__
        time.sleep(0.2)


def _forker(world: Any, trial: Trial, rng: random.Random, first: threading.Event) -> None:
    made = [trial.cid]
    for n in range(2 if world.quick else FORKS):
        source, to = rng.choice(made), f"{trial.cid}-k{n}"
        trial.forks[to] = _fork(world, trial, source, to)
        first.set()
        if trial.forks[to] == 201:
            made.append(to)
            with contextlib.suppress(httpx.HTTPError):
                url = f"{_conversations(trial)}/{to}/snapshots"
                trial.statuses.append(world.client(trial.user).post(url, json={}).status_code)
    first.set()


def start_forking(world: Any, trial: Trial) -> None:
    """Before the DELETE: the forker starts; returns once its first fork answered, so
    the DELETE meets forks in flight."""
    first = threading.Event()
    rng = random.Random(world.rng.random())  # its own: the forker is another thread
    trial.threads.append(background(_forker, world, trial, rng, first))
    first.wait(30)


def delete_a_fork(world: Any, trial: Trial) -> None:
    """At the trial's moment, a fork made so far is deleted (its own forks may be in
    flight from it)."""
    time.sleep(trial.delay)
    made = [to for to, status in list(trial.forks.items()) if status == 201]
    if not made:
        trial.notes.append("no fork made yet when one was to be deleted")
        return
    r = world.client(trial.user).delete(f"{_conversations(trial)}/{world.rng.choice(made)}")
    trial.statuses.append(r.status_code)


def _prefix(trial: Trial, cid: str) -> tuple[Scope, str]:
    scope = Scope(DEFAULT_TENANT, naming.session_name_for(trial.user))
    return scope, Layout("workspaces/").conversation(scope, cid)


def _missing(world: Any, trial: Trial, cid: str) -> int:
    """Objects the live conversation's records (and its snapshots') name, not in the bucket."""
    scope, prefix = _prefix(trial, cid)
    layout = Layout("workspaces/")

    async def count() -> int:
        store = S3Store(world.store.settings(world.bucket))
        try:
            meta = Metadata(store, layout)
            copies = StoreCopies(store, layout, meta)
            present = {i.key async for i in store.list(prefix)}
            manifest = await meta.get(scope, cid)
            wanted = [layout.file(scope, cid, r.file_path)
                      for r in (manifest.files if manifest else []) if r.active]  # fmt: skip
            for snap in await copies.list(scope, cid):
                wanted += [copies._file(scope, cid, snap.snapshot_id, r.file_path)
                           for r in snap.records]  # fmt: skip
            return sum(1 for key in wanted if key not in present)
        finally:
            await store.aclose()

    return asyncio.run(count())


def _wait_gone(world: Any, trial: Trial, cid: str) -> bool:
    deadline = time.monotonic() + DEADLINE
    while time.monotonic() < deadline:
        if world.workspace(trial.user, cid) is None:
            return True
        time.sleep(0.05)
    return False


def settle(world: Any, trial: Trial, objects: Callable[[str], int]) -> dict[str, int]:
    """Every fork the trial asked for checked (module docstring), then deleted;
    ``objects(cid)`` counts what is left under a conversation's prefix."""
    counts = {"leaked_objects": 0, "lost_objects": 0, "partial_forks": 0, "stuck": 0}
    client = world.client(trial.user)
    for to, status in sorted(trial.forks.items()):
        cws = world.workspace(trial.user, to)
        if cws is not None and not cws["metadata"].get("deletionTimestamp"):
            lost = _missing(world, trial, to)
            counts["lost_objects"] += lost
            if lost:
                trial.notes.append(f"fork {to} ({status}): {lost} objects its records name lost")
            if status != 201:
                counts["partial_forks"] += 1
                trial.notes.append(f"fork {to} exists though its request ended {status}")
            r = client.delete(f"{_conversations(trial)}/{to}")
            if r.status_code not in (200, 202, 404):
                trial.notes.append(f"DELETE of fork {to} answered {r.status_code}")
        if not _wait_gone(world, trial, to):
            counts["stuck"] += 1
            continue
        left = objects(to)
        counts["leaked_objects"] += left
        if left:
            trial.notes.append(f"fork {to} ({status}): {left} objects left after it went")
    return counts


# --quick (the test command runs it) keeps one trial of the first; the API killed
# mid-fork (an API restart per trial) runs in the full run only.
FAULTS = [
    Fault("store: forks and snapshots made while origins and forks are deleted",
          delete_a_fork, start_forking, check=settle, quick_trials=1),
    Fault("store: API killed mid-fork", kill_api, start_forking, check=settle,
          quick_trials=0),
]  # fmt: skip
