"""api/e2b/watchers.py: the per-sandbox cap on directory watchers holds for creates that
are all under way at once (each waits on its listing), and a create whose listing fails
keeps no slot."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from sandbox_workspace.api.e2b import watchers
from sandbox_workspace.api.identity import Caller
from sandbox_workspace.api.quotas import Quotas, UserLimits


class _Sandbox:
    """What ``watchers.unary`` uses of a sandbox; its listing waits for ``listed``."""

    def __init__(self, services, listed: asyncio.Event, fail: bool = False) -> None:
        self.session = SimpleNamespace(session_id="sb-session-x")
        self.cid = "c1"
        self.caller = Caller("alice", "jwt", "acme")
        self.services = services
        self.listed, self.fail = listed, fail

    async def fs(self, op: str, rel: str, depth: int) -> list[dict]:
        await self.listed.wait()
        if self.fail:
            raise RuntimeError("listing failed")
        return []


@pytest.fixture
def services():
    quotas = Quotas(e2b_watchers_per_user=64, e2b_watchers_per_tenant=64)
    settings = SimpleNamespace(quotas=quotas)
    yield SimpleNamespace(
        settings=settings, user_limits=UserLimits(quotas, runtime_connections=256)
    )
    for wid in list(watchers._WATCHERS):
        watchers._drop(wid)


def test_concurrent_creates_stop_at_the_sandboxs_cap(services):
    async def main() -> list:
        listed = asyncio.Event()
        sandbox = _Sandbox(services, listed)
        creates = [
            asyncio.ensure_future(watchers.unary("CreateWatcher", sandbox, {"path": "uploads"}))
            for _ in range(watchers.MAX_PER_SANDBOX + 3)
        ]
        await asyncio.sleep(0)  # every create is at its listing now
        listed.set()
        return await asyncio.gather(*creates, return_exceptions=True)

    got = asyncio.run(main())
    refused = [r for r in got if isinstance(r, watchers.TooManyWatchers)]
    assert len(got) - len(refused) == watchers.MAX_PER_SANDBOX, got
    assert len(refused) == 3


def test_a_create_whose_listing_fails_keeps_no_slot(services):
    async def main() -> None:
        listed = asyncio.Event()
        listed.set()
        with pytest.raises(RuntimeError):
            await watchers.unary("CreateWatcher", _Sandbox(services, listed, fail=True), {})

    asyncio.run(main())
    assert not watchers._WATCHERS
    caps = watchers.caps(services).watchers
    assert caps.user.held('["acme", "alice"]') == 0 and caps.total.held("") == 0
