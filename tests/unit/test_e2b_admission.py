"""api/e2b/admission.py: the per-user, per-tenant and per-process caps of what an E2B
caller holds open, and the streaming answer that holds a slot (released however it ends,
a client that stopped reading given up)."""

from __future__ import annotations

import asyncio
import time

import pytest
from starlette.requests import ClientDisconnect

from sandbox_workspace.api.e2b import admission
from sandbox_workspace.api.e2b.admission import Caps, HeldStream
from sandbox_workspace.api.identity import Caller
from sandbox_workspace.api.quotas import Quotas, TooManyAtOnce, UserLimits


def _caps() -> Caps:
    total = UserLimits(Quotas(), runtime_connections=8).runtime_streams
    return Caps("E2B streams", (2, "e2b_streams_per_user"), (3, "e2b_streams_per_tenant"),
                total)  # fmt: skip


def test_one_user_then_one_tenant_then_the_process_reach_their_cap():
    caps = _caps()
    alice, bob, carol = (
        Caller("alice", "jwt", "acme"),
        Caller("bob", "jwt", "acme"),
        Caller("carol", "jwt", "globex"),
    )
    held = [caps.take(alice), caps.take(alice)]
    with pytest.raises(TooManyAtOnce, match=r"at most 2 at once per user .*E2B_STREAMS_PER_USER"):
        caps.take(alice)
    # The same user id in another tenant is another user.
    held.append(caps.take(Caller("alice", "jwt", "globex")))
    held.append(caps.take(bob))
    with pytest.raises(TooManyAtOnce, match=r"at most 3 at once per tenant"):
        caps.take(bob)
    with pytest.raises(TooManyAtOnce, match=r"at most 4 at once on this API replica \(half of"):
        caps.take(carol)
    # A refusal takes nothing; a release (twice: idempotent) frees each level once.
    held.pop()()
    held[0]()
    held[0]()
    assert caps.user.held('["acme", "alice"]') == 1 and caps.tenant.held("acme") == 1
    caps.take(carol)
    assert caps.total.held("") == 3


def test_executions_and_e2b_streams_share_the_replicas_bound():
    """/execute and E2B streams each hold a runtime connection while code runs: at most
    half of the pool together (here 8 // 2), an execution refused there keeps no slot."""
    limits = UserLimits(Quotas(), runtime_connections=8)
    caps = Caps("E2B streams", (8, "e2b_streams_per_user"), (8, "e2b_streams_per_tenant"),
                limits.runtime_streams)  # fmt: skip
    a, b, e = (Caller(user, "jwt") for user in "abe")
    held = [limits.take_execution(a), limits.take_execution(b)]
    held += [caps.take(Caller("carol", "jwt", "acme")), caps.take(Caller("dan", "jwt", "acme"))]
    for refused in (lambda: limits.take_execution(e), lambda: caps.take(e)):
        with pytest.raises(TooManyAtOnce, match=r"at most 4 at once on this API replica \(half of"
                           r" SANDBOX_WORKSPACE_RUNTIME_CONNECTIONS\)"):  # fmt: skip
            refused()
    assert limits.executions.user.held('["default", "e"]') == 0  # the user's slot went back
    assert limits.executions.tenant.held("default") == 2
    held[0]()
    held[0]()  # idempotent: frees one replica slot, once
    release = limits.take_execution(e)
    assert limits.runtime_streams.held("") == 4
    for r in [release, *held]:
        r()
    assert limits.runtime_streams.held("") == 0 and limits.executions.tenant.held("default") == 0


def test_executions_are_capped_per_tenant_before_the_replica():
    """One tenant's users cannot take every /execute slot of the replica: past the
    tenant's cap they are refused naming it, and another tenant's users still run."""
    limits = UserLimits(Quotas(executions_per_tenant=3), runtime_connections=16)
    held = [limits.take_execution(Caller(user, "jwt", "acme")) for user in ("a", "a", "b")]
    with pytest.raises(
        TooManyAtOnce, match=r"at most 3 at once per tenant .*EXECUTIONS_PER_TENANT"
    ):
        limits.take_execution(Caller("c", "jwt", "acme"))
    assert limits.runtime_streams.held("") == 3  # the refusal took no replica slot
    held.append(limits.take_execution(Caller("a", "jwt", "globex")))  # the same name elsewhere
    held.pop(0)()
    held.append(limits.take_execution(Caller("c", "jwt", "acme")))
    for release in held:
        release()
    assert limits.runtime_streams.held("") == 0


def _drive(response: HeldStream, send, spec: str = "2.3") -> None:
    """Serve ``response`` as uvicorn does (ASGI 2.3: Starlette also listens for the
    client's disconnect beside it) or as a 2.4 server would."""

    async def receive():
        await asyncio.Event().wait()

    scope = {"type": "http", "asgi": {"spec_version": spec}}
    asyncio.run(asyncio.wait_for(response(scope, receive, send), 10))


def test_a_held_stream_releases_its_slot_and_closes_its_source_when_it_ends():
    released, closed = [], []

    async def source():
        try:
            yield b"one"
            yield b"two"
        finally:
            closed.append(True)

    sent = []

    async def send(message):
        sent.append(message.get("body"))

    _drive(HeldStream(source(), lambda: released.append(1), "text/plain"), send)
    assert sent[1:] == [b"one", b"two", b""] and released == [1] and closed == [True]


@pytest.mark.parametrize("spec", ["2.3", "2.4"])
def test_a_client_that_stops_reading_is_given_up_and_its_slot_freed(monkeypatch, spec):
    monkeypatch.setattr(admission, "SEND_SECONDS", 0.2)
    released, closed = [], []

    async def source():
        try:
            while True:
                yield b"output"
        finally:
            closed.append(True)

    async def send(message):
        if message["type"] == "http.response.body":
            await asyncio.Event().wait()  # the client's window is full, for good

    # The answer fails at the deadline (not at _drive's own guard, 10 s): the server
    # closes the connection.
    started = time.monotonic()
    with pytest.raises((TimeoutError, ClientDisconnect)):
        _drive(HeldStream(source(), lambda: released.append(1), "text/plain"), send, spec)
    assert time.monotonic() - started < 5
    assert released == [1] and closed == [True]
