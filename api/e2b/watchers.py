"""envd's directory watchers (``files.watch_dir``) by polling the sandbox's listing.

Contract: ``CreateWatcher`` (the sync SDK) takes a snapshot of the directory (names, sizes,
modification times; ``recursive`` down to ``MAX_DEPTH``) and answers a watcher id;
``GetWatcherEvents`` lists again and answers what changed since the last look, as
envd's events: a new path is ``CREATE``, a gone one ``REMOVE``, a changed size or time
``WRITE`` (a rename is a ``REMOVE`` and a ``CREATE``); ``RemoveWatcher`` drops it. What a
watcher keeps of a look is ``watch_listing.Snapshot``'s: hashes and compressed paths,
bounded (a listing past the bound answers ``directory_too_large``).
``WatchDir`` (the async SDK's stream) looks every ``POLL_SECONDS`` and sends the same
events. At most ``MAX_PER_SANDBOX`` watchers per sandbox, and per user, per tenant and
per API process as ``admission.caps(services).watchers`` says (quotas
``e2b_watchers_per_user``/``_per_tenant``, then ``admission.MAX_WATCHERS`` for all
tenants together) — then ``resource_exhausted``; a watcher nobody asked for
``IDLE_SECONDS`` is dropped (and its slots freed). Watchers live in the API process that
created them.

Why polling, not inotify: it needs nothing new in the runtime (the listing is the file
calls' own, confined as every execution), it holds no kernel watches that tenants share
(``fs.inotify.max_user_watches``), and the sync SDK itself polls. What it cannot see: a
file made and removed between two looks, and a write that keeps size and time.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from sandbox_workspace.contract.errors import ApiError, NotFoundError

from ..quotas import TooManyAtOnce
from . import connect
from .admission import caps
from .conversation import Sandbox
from .paths import to_relative
from .watch_listing import EMPTY, Listing, Snapshot, changes

MAX_DEPTH = 16
MAX_PER_SANDBOX = 8
IDLE_SECONDS = 600.0
POLL_SECONDS = 0.5


class TooManyWatchers(ApiError):
    status, code = 429, "too_many_watchers"


class WatcherNotFound(NotFoundError):
    code = "watcher_not_found"


@dataclass
class Watcher:
    sandbox: tuple[str, str]  # (session id, conversation id): ``owner``
    rel: str
    depth: int
    seen: Snapshot
    release: Callable[[], None]  # its slots of the caller's caps
    used: float = field(default_factory=time.monotonic)


_WATCHERS: dict[str, Watcher] = {}


async def listing(sandbox: Sandbox, rel: str, depth: int) -> Listing:
    entries = await sandbox.fs("list", rel, depth=depth)
    # A directory's own time changes with its entries: only its coming and going count.
    return {e["rel"]: (0, "") if e["dir"] else (e["size"], e["mtime"]) for e in entries}


def _drop(wid: str) -> None:
    watcher = _WATCHERS.pop(wid, None)
    if watcher is not None:
        watcher.release()


def _drop_idle() -> None:
    now = time.monotonic()
    for wid in [w for w, x in _WATCHERS.items() if now - x.used > IDLE_SECONDS]:
        _drop(wid)


def owner(sandbox: Sandbox) -> tuple[str, str]:
    """Whose a watcher is: conversation ids are per session (two users' attached chats
    may share one), so the session goes with it."""
    return (sandbox.session.session_id, sandbox.cid)


def _admit(sandbox: Sandbox) -> Callable[[], None]:
    """One watcher's slots (the release), or ``TooManyWatchers`` naming the cap."""
    _drop_idle()
    if sum(1 for w in _WATCHERS.values() if w.sandbox == owner(sandbox)) >= MAX_PER_SANDBOX:
        raise TooManyWatchers(
            f"at most {MAX_PER_SANDBOX} directory watchers per sandbox; stop one first"
        )
    try:
        return caps(sandbox.services).watchers.take(sandbox.caller)
    except TooManyAtOnce as e:
        raise TooManyWatchers(e.message) from None


def _watched(message: dict) -> tuple[str, int]:
    rel = to_relative(message.get("path"))
    return rel, MAX_DEPTH if message.get("recursive") else 1


def _mine(sandbox: Sandbox, message: dict) -> tuple[str, Watcher]:
    wid = str(message.get("watcherId") or "")
    watcher = _WATCHERS.get(wid)
    if watcher is None or watcher.sandbox != owner(sandbox):
        raise WatcherNotFound(f"no watcher {wid!r} in this sandbox")
    watcher.used = time.monotonic()
    return wid, watcher


async def unary(method: str, sandbox: Sandbox, message: dict) -> dict:
    if method == "CreateWatcher":
        rel, depth = _watched(message)
        release = _admit(sandbox)
        # Stored before the listing's await: creates under way count against the
        # sandbox's cap (counted only once stored, all passed it while listing). Its id
        # is not answered yet, so nobody reads the empty listing meanwhile.
        wid = secrets.token_urlsafe(12)
        _WATCHERS[wid] = watcher = Watcher(owner(sandbox), rel, depth, EMPTY, release)
        try:
            watcher.seen = Snapshot.of(await listing(sandbox, rel, depth))
        except BaseException:
            _drop(wid)
            raise
        return {"watcherId": wid}
    if method == "GetWatcherEvents":
        _, watcher = _mine(sandbox, message)
        now = await listing(sandbox, watcher.rel, watcher.depth)
        seen = Snapshot.of(now)  # past the bound: the error, and the last look kept
        events = changes(watcher.seen, now, watcher.rel)
        watcher.seen = seen
        return {"events": events}
    if method == "RemoveWatcher":
        wid, _ = _mine(sandbox, message)
        _drop(wid)
        return {}
    raise NotImplementedError(method)


UNARY = ("CreateWatcher", "GetWatcherEvents", "RemoveWatcher")


async def watch_stream(sandbox: Sandbox, message: dict) -> AsyncIterator[bytes]:
    """``WatchDir``: ``start``, then each change as it is seen (one watcher's slot)."""
    wid = secrets.token_urlsafe(12)
    try:
        rel, depth = _watched(message)  # in the try: a bad path ends the stream with it
        watcher = _WATCHERS[wid] = Watcher(owner(sandbox), rel, depth, EMPTY, _admit(sandbox))
        watcher.seen = Snapshot.of(await listing(sandbox, rel, depth))
        yield connect.envelope({"start": {}})
        while True:
            await asyncio.sleep(POLL_SECONDS)
            watcher.used = time.monotonic()
            now = await listing(sandbox, rel, depth)
            seen = Snapshot.of(now)  # past the bound: the stream ends with the error
            for event in changes(watcher.seen, now, rel):
                yield connect.envelope({"filesystem": event})
            watcher.seen = seen
    except ApiError as e:
        yield connect.end_stream(connect.code_for_status(e.status), e.message)
    finally:
        _drop(wid)
