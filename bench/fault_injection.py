"""The faults ``bench.faults`` injects while a conversation is being deleted.

Each injector is ``inject(world, trial) -> None``: called in its own thread right after
the trial's DELETE was sent, it waits a random moment (``trial.delay``) and then does its
damage, healing it before returning (a killed operator is started again, …) — except
where the fault is the point of the trial (the session deleted concurrently). The
``before_delete`` hook of a fault runs before the DELETE (the operator stopped, agent
code started). Injectors touch only loopback processes and the test apiserver.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

# Writers that do not stop by themselves and re-create their directory with absolute
# paths (a deleted cwd would stop a naive one): a daemonised one (setsid, its own
# session) and the execution itself — what agent code writing through a deletion looks
# like when it means it. (The runtime ends an execution's leftover processes when the
# execution ends, so the execution keeps going for up to 6 s.)
AGENT_WRITERS = """
D=$PWD
setsid nohup sh -c 'i=0; while [ $i -lt 4000 ]; do mkdir -p "$0/outputs/bg" && \
  echo $i > "$0/outputs/bg/f$i"; i=$((i+1)); sleep 0.005; done' "$D" >/dev/null 2>&1 &
i=0
while [ $i -lt 1200 ]; do
  mkdir -p "$D/outputs/fg" && echo $i > "$D/outputs/fg/f$i"; i=$((i+1)); sleep 0.005
done
"""


@dataclass
class Trial:
    fault: str
    index: int
    user: str
    cid: str
    delay: float  # seconds after the DELETE at which the fault strikes
    directory: Path = Path()
    notes: list[str] = field(default_factory=list)
    threads: list[threading.Thread] = field(default_factory=list)
    statuses: list[int] = field(default_factory=list)  # racing writes' answers
    released_early: bool = False  # the resource went while its files still existed
    release: threading.Event | None = None  # a held upload's client, freed by kill_api
    forks: dict[str, int | str] = field(default_factory=dict)  # fork id → its answer


def background(fn: Any, *args: Any) -> threading.Thread:
    thread = threading.Thread(target=fn, args=args, daemon=True)
    thread.start()
    return thread


# -- before the DELETE ---------------------------------------------------------------


def stop_operator_first(world: Any, trial: Trial) -> None:
    world.stack.stop_operator()


def _start_execution(world: Any, trial: Trial, code: str, *paths: str) -> None:
    """Agent code started in the background (its answer kept in ``trial.statuses``);
    returns once every one of ``paths`` (relative to the conversation) exists."""
    client = world.client(trial.user)
    url = f"/api/v1/sessions/sb-session-{trial.user}/execute"
    body = {"conversation_id": trial.cid, "language": "bash", "code": code}

    def execution() -> None:
        with contextlib.suppress(httpx.HTTPError):
            trial.statuses.append(client.post(url, json=body).status_code)

    trial.threads.append(background(execution))
    deadline = time.monotonic() + 10
    while not all((trial.directory / p).exists() for p in paths):
        if time.monotonic() > deadline:
            trial.notes.append(f"{', '.join(paths)} did not appear within 10 s")
            return
        time.sleep(0.005)


def start_agent_writers(world: Any, trial: Trial) -> None:
    _start_execution(world, trial, AGENT_WRITERS, "outputs/fg", "outputs/bg")


# -- after the DELETE ------------------------------------------------------------------


def kill_runtime(world: Any, trial: Trial) -> None:
    time.sleep(trial.delay)
    try:
        world.agent.kill(world.namespace, world.pod_name(trial.user), signal.SIGKILL)
    except LookupError as e:  # already gone or restarting: a fault all the same
        trial.notes.append(f"runtime not running at the moment: {e}")


def kill_operator(world: Any, trial: Trial) -> None:
    time.sleep(trial.delay)
    world.stack.stop_operator(kill=True)
    time.sleep(world.rng.uniform(0.1, 1.0))
    world.stack.start_operator()


def restart_apiserver(world: Any, trial: Trial) -> None:
    time.sleep(trial.delay)
    # On the world's long-lived thread: control-plane processes die with the thread
    # that started them (PR_SET_PDEATHSIG), and this one ends in a moment.
    down = world.rng.uniform(0.0, 1.0)
    world.owner.submit(world.plane.restart_apiserver, down_seconds=down).result()


def start_operator_later(world: Any, trial: Trial) -> None:
    time.sleep(trial.delay + world.rng.uniform(0.2, 1.5))
    world.stack.start_operator()


def delete_session(world: Any, trial: Trial) -> None:
    time.sleep(trial.delay)
    r = world.client(trial.user).delete(f"/api/v1/sessions/sb-session-{trial.user}")
    trial.statuses.append(r.status_code)


def race_uploads(world: Any, trial: Trial) -> None:
    client = world.client(trial.user)
    time.sleep(trial.delay)
    for n in range(3):
        with contextlib.suppress(httpx.HTTPError):
            r = client.post(
                f"/api/v1/sessions/sb-session-{trial.user}/files/upload",
                files={"file": (f"racing-{n}.txt", b"racing upload")},
                data={"conversation_id": trial.cid},
            )
            trial.statuses.append(r.status_code)
        time.sleep(world.rng.uniform(0.0, 0.05))


# -- store faults (store mode s3: ``world.store`` is the SeaweedFS of the trial) ----------


def _pause_store(world: Any, seconds: float) -> None:
    """The store answers nothing for ``seconds`` (its process group stopped, then
    continued): connections hang as with a store that is down or partitioned."""
    pgid = world.store.proc.pid
    os.killpg(pgid, signal.SIGSTOP)
    try:
        time.sleep(seconds)
    finally:
        os.killpg(pgid, signal.SIGCONT)


def store_down(world: Any, trial: Trial) -> None:
    # Within the first 50 ms: a deletion in store mode takes ~130 ms without a fault.
    time.sleep(trial.delay / 5)
    _pause_store(world, world.rng.uniform(1.0, 3.0))


def start_store_slow(world: Any, trial: Trial) -> None:
    """From before the DELETE on, every request waits: the store is frozen 60 ms of
    every 100 ms for 3 s."""

    def slow() -> None:
        until = time.monotonic() + 3.0
        while time.monotonic() < until:
            _pause_store(world, 0.06)
            time.sleep(0.04)

    trial.threads.append(background(slow))


LATE_OUTPUT = "echo late > outputs/late.txt; sleep 30"


def start_late_output(world: Any, trial: Trial) -> None:
    """Code writes an output and keeps running: the output is not written back yet."""
    _start_execution(world, trial, LATE_OUTPUT, "outputs/late.txt")


UPLOAD_SIZE = 24 * 1024 * 1024  # three parts of a multipart put: in flight a while


def start_upload(world: Any, trial: Trial) -> None:
    """An upload streams to the cache and the store at once (its answer kept)."""
    client = world.client(trial.user)
    url = f"/api/v1/sessions/sb-session-{trial.user}/files/upload"

    def upload() -> None:
        with contextlib.suppress(httpx.HTTPError):
            r = client.post(
                url,
                data={"conversation_id": trial.cid},
                files={"file": ("in-flight.csv", b"x" * UPLOAD_SIZE)},
            )
            trial.statuses.append(r.status_code)

    trial.threads.append(background(upload))
    time.sleep(world.rng.uniform(0.0, 0.3))  # somewhere in the body, or past it


def _store_uploads(world: Any, trial: Trial) -> list:
    """Incomplete multipart uploads under the trial's conversation (a listing misses them)."""
    import asyncio

    from sandbox_workspace.operator import naming
    from sandbox_workspace.store.layout import DEFAULT_TENANT, Layout, Scope
    from sandbox_workspace.store.s3_admin import S3Admin

    scope = Scope(DEFAULT_TENANT, naming.session_name_for(trial.user))
    prefix = Layout("workspaces/").conversation(scope, trial.cid)

    async def listing() -> list:
        admin = S3Admin(world.store.settings(world.bucket))
        try:
            return await admin.uploads(prefix)
        finally:
            await admin.aclose()

    return asyncio.run(listing())


def start_held_upload(world: Any, trial: Trial) -> None:
    """A large upload whose client stops sending mid-body, once the store holds parts of
    its multipart upload: the API is then killed with the parts in the bucket."""
    held = threading.Event()
    trial.threads.append(background(_held_upload, world, trial, held))
    deadline = time.monotonic() + 30
    while not _store_uploads(world, trial) and time.monotonic() < deadline:
        time.sleep(0.1)
    trial.notes.append(f"multipart uploads under way: {len(_store_uploads(world, trial))}")
    trial.release = held  # set after the API was killed (``kill_api``)


def _held_upload(world: Any, trial: Trial, held: threading.Event) -> None:
    boundary = "heldupload"
    head = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="conversation_id"\r\n\r\n'
        f'{trial.cid}\r\n--{boundary}\r\nContent-Disposition: form-data; name="file"; '
        'filename="held.csv"\r\nContent-Type: text/csv\r\n\r\n'
    ).encode()

    def body():
        yield head
        for i in range(40):
            if i == 24:
                held.wait(120)
            yield b"x" * (1024 * 1024)
        yield f"\r\n--{boundary}--\r\n".encode()

    with contextlib.suppress(httpx.HTTPError):
        world.client(trial.user).post(
            f"/api/v1/sessions/sb-session-{trial.user}/files/upload",
            headers={"Content-Type": f"multipart/form-data; boundary={boundary}"},
            content=body(),
        )


def kill_api(world: Any, trial: Trial) -> None:
    """SIGKILL the API (an upload between its store write and its cache write, the
    DELETE in its hands), then start it again; clients follow it to its new port."""
    time.sleep(trial.delay)
    proc = world.stack.api
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    if trial.release is not None:
        trial.release.set()  # the held upload's client may end now
    world.stack.api = None
    world.owner.submit(world.stack.start_api).result()
    world.api_moved()


def nothing(world: Any, trial: Trial) -> None:
    return None


@dataclass(frozen=True)
class Fault:
    name: str
    inject: Any
    before_delete: Any = None
    own_session: bool = False  # the fault destroys the session: one per trial
    # After the trial's own counts: ``check(world, trial, objects) -> counts`` adds its
    # own (``bench.fork_trial.settle``).
    check: Any = None
    quick_trials: int | None = None  # fewer in --quick (the test command's budget)


FAULTS = [
    Fault("none (control)", nothing),
    Fault("runtime killed", kill_runtime),
    Fault("operator killed and restarted", kill_operator),
    Fault("apiserver restarted", restart_apiserver),
    Fault("operator down when the delete arrives", start_operator_later, stop_operator_first),
    Fault("session deleted concurrently", delete_session, own_session=True),
    Fault("upload racing the delete", race_uploads),
    Fault("agent code writing through the delete", nothing, start_agent_writers),
]

# Run on a second stack in store mode s3 (a real SeaweedFS): ``leaked_objects`` counts
# what is left under the conversation's prefix in the bucket.
STORE_FAULTS = [
    Fault("store: none (control)", nothing),
    Fault("store: down during the delete", store_down),
    Fault("store: slow", nothing, start_store_slow),
    Fault("store: pod lost with an output not yet written back", kill_runtime, start_late_output),
    Fault("store: API killed between the store write and the cache write", kill_api, start_upload),
    Fault("store: operator killed mid-delete", kill_operator),
    Fault(
        "store: API killed mid-upload (multipart parts in the bucket)", kill_api, start_held_upload
    ),
]
