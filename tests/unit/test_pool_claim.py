"""The claimed pool pod's answer to ``POST /v1/claim`` (operator/pool/claim.py
``deliver_token``): only a 200 whose JSON object names the network asked for is a
delivery; any other answer — an error status, no JSON, JSON that is not an object, no
network — is a refusal with a log line saying what came back, never an exception (the
claim then deletes that pod and tries the next, or starts the session cold).
The runtime is answered on MockTransport: the shapes a real one never sends.
And ``claim_pod``: the token goes to the pod in the same round trip as its swap, and a pod
that took it without becoming the session's (the swap lost, the Secret refused) is deleted
(the apiserver: ``FakeKube``)."""

from __future__ import annotations

import asyncio
import copy
import json
import logging
import random
from types import SimpleNamespace

import httpx
import pytest
from fake_kube import FakeKube
from prometheus_client import CollectorRegistry

from sandbox_workspace.kube import KubeConflict, core_path
from sandbox_workspace.operator.context import OperatorContext
from sandbox_workspace.operator.models import SandboxSession, SandboxSessionSpec
from sandbox_workspace.operator.pool import PoolMetrics, PoolState
from sandbox_workspace.operator.pool.claim import claim_pod, deliver_token
from sandbox_workspace.operator.pool.spec import CLAIMED, FREE, LABEL_POOL
from sandbox_workspace.operator.settings import OperatorSettings

POD = {"metadata": {"name": "pool-1", "uid": "u1"}, "status": {"podIP": "10.0.0.7"}}
EGRESS = {"proxy_port": 3128, "code_env": {}}


async def delivered(status: int, content: bytes, egress: dict | None = EGRESS) -> bool:
    answer = httpx.MockTransport(lambda request: httpx.Response(status, content=content))
    async with httpx.AsyncClient(transport=answer) as http:
        ctx = SimpleNamespace(http=http, pool=None)
        return await deliver_token(ctx, POD, "key", "token", egress)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("content", "said"),
    [
        (b"[]", "not a JSON object: list"),
        (b'"proxy_port"', "not a JSON object: str"),
        (b"null", "not a JSON object: NoneType"),
        (b"<html>", "not JSON"),
        (b'{"network": ["proxy_port"]}', "names no network"),
        (b"{}", "names no network"),
        (b'{"network": "deny"}', "deny"),
    ],
)
async def test_a_claim_answer_without_the_network_asked_for_is_a_refusal(
    content: bytes, said: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, "sandbox_workspace.operator.pool"):
        assert await delivered(200, content) is False
    (record,) = caplog.records
    assert record.getMessage() == "claimed pod did not take the network asked for"
    assert said in record.answered and record.pod == "pool-1"  # type: ignore[attr-defined]


async def test_the_network_asked_for_is_a_delivery_and_no_network_asked_needs_none() -> None:
    assert await delivered(200, b'{"network": "proxy_port"}') is True
    assert await delivered(200, b"[]", egress=None) is True  # the token alone: 200 says it
    assert await delivered(403, b'{"network": "proxy_port"}') is False


# -- the swap and the delivery in one round trip (``claim_pod``) ----------------------

NS = "sessions"


class SwapWaitsForDelivery(FakeKube):
    """The apiserver answers the pod's swap only once the runtime was handed the token
    (else a timeout): the two are in flight at once. ``lose``: the swap is refused, as
    when another claim moved the pod first."""

    def __init__(self, delivered: asyncio.Event, lose: bool = False) -> None:
        super().__init__()
        self.delivered, self.lose = delivered, lose

    async def patch(self, path: str, body: dict) -> dict | None:
        if "/pods/" in path:
            async with asyncio.timeout(5):
                await self.delivered.wait()
            if self.lose:
                self.calls.append(("patch", path))
                raise KubeConflict(409, f"{path}: the object has been modified", "Conflict")
        return await super().patch(path, body)


async def claim(lose: bool = False, alongside_ok: bool | None = None):
    """One claim of the one free pod: (the claimed pod or None, the apiserver, what the
    runtime was sent)."""
    delivered, sent = asyncio.Event(), []

    def runtime(request: httpx.Request) -> httpx.Response:
        sent.append(request.read())
        delivered.set()
        return httpx.Response(200, json={"claimed": True, "network": "deny"})

    kube = SwapWaitsForDelivery(delivered, lose)
    pod = kube.put(
        core_path(NS, "pods", "pool-1"),
        {"metadata": {"labels": {}}, "status": {"podIP": "10.0.0.7"}},
    )
    ctx = OperatorContext(OperatorSettings(_env_file=None), kube=kube)  # type: ignore[arg-type]
    ctx.pool = PoolState((NS,), 1, PoolMetrics(CollectorRegistry()))
    ctx.pool.keys[NS] = "claim-key"
    ctx.pool.note_free(NS, pod, ready=True)
    session = SandboxSession(
        name="sb-session-a",
        namespace=NS,
        spec=SandboxSessionSpec.model_validate({"userId": "a", "storage": {"persistent": False}}),
    )
    body = {
        "apiVersion": "v1",
        "kind": "SandboxSession",
        "metadata": {"name": "sb-session-a", "uid": "s1"},
    }

    async def alongside() -> bool:
        return bool(alongside_ok)

    async with httpx.AsyncClient(transport=httpx.MockTransport(runtime)) as http:
        ctx.http = http
        claimed = await claim_pod(
            ctx,
            session,
            body,
            token="t" * 32,
            alongside=alongside if alongside_ok is not None else None,
        )
    return claimed, kube, sent


async def test_the_token_goes_to_the_pod_in_the_same_round_trip_as_the_swap() -> None:
    claimed, kube, sent = await claim()
    assert (
        claimed is not None
        and claimed["metadata"]["labels"]["sandboxworkspace.io/pool"] == "claimed"
    )
    assert len(sent) == 1 and b'"token"' in sent[0]
    assert kube.verbs("delete") == []


async def test_a_pod_that_took_the_token_but_was_swapped_to_another_is_deleted() -> None:
    """The swap lost (409) after the runtime took this session's token: that pod is
    nobody's to give now, so it is deleted and the session starts cold (None)."""
    claimed, kube, sent = await claim(lose=True)
    assert claimed is None and len(sent) == 1
    assert kube.verbs("delete") == [core_path(NS, "pods", "pool-1")]
    assert "deletionTimestamp" in kube.objects[core_path(NS, "pods", "pool-1")]["metadata"]


async def test_a_refused_alongside_write_deletes_the_pod_that_took_the_token() -> None:
    claimed, kube, sent = await claim(alongside_ok=False)
    assert claimed is None and len(sent) == 1
    assert kube.verbs("delete") == [core_path(NS, "pods", "pool-1")]
    claimed, kube, _ = await claim(alongside_ok=True)
    assert claimed is not None and kube.verbs("delete") == []


# -- a lost swap after the token was taken: read again, not burned blindly -----------------


class OnceRuntimes:
    """Pool pods' runtimes by IP, each taking one token as ``runtime/claim.py`` does: the
    same again is 200, another 409. ``delay``: each answers after a random pause."""

    def __init__(self, delay: float = 0.0) -> None:
        self.tokens: dict[str, str] = {}
        self.delay = delay

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        await asyncio.sleep(random.uniform(0, self.delay))
        ip, token = request.url.host, json.loads(request.content)["token"]
        if self.tokens.setdefault(ip, token) != token:
            return httpx.Response(409, json={"code": "already_claimed"})
        return httpx.Response(200, json={"claimed": True, "network": "deny"})


class SlowKube(FakeKube):
    """Writes answered after a random pause: racing claims interleave."""

    async def patch(self, path: str, body: dict) -> dict | None:
        await asyncio.sleep(random.uniform(0, 0.003))
        return await super().patch(path, body)


def replica(kube: FakeKube, http: httpx.AsyncClient, pods: list[dict]) -> OperatorContext:
    """An operator replica whose hint holds ``pods`` as it saw them."""
    ctx = OperatorContext(OperatorSettings(_env_file=None), kube=kube)  # type: ignore[arg-type]
    ctx.pool = PoolState((NS,), len(pods), PoolMetrics(CollectorRegistry()))
    ctx.pool.keys[NS] = "claim-key"
    ctx.http = http
    for pod in pods:
        ctx.pool.note_free(NS, copy.deepcopy(pod), ready=True)
    return ctx


def pool_pods(kube: FakeKube, n: int) -> list[dict]:
    return [
        kube.put(
            core_path(NS, "pods", f"pool-{i}"),
            {"metadata": {"labels": {LABEL_POOL: FREE}}, "status": {"podIP": f"10.0.0.{i}"}},
        )
        for i in range(n)
    ]


async def claim_for(ctx: OperatorContext, name: str, uid: str | None = None) -> dict | None:
    session = SandboxSession(
        name=name,
        namespace=NS,
        spec=SandboxSessionSpec.model_validate({"userId": name, "storage": {"persistent": False}}),
    )
    body = {"apiVersion": "v1", "kind": "SandboxSession", "metadata": {"name": name}}
    body["metadata"]["uid"] = uid or f"uid-{name}"
    return await claim_pod(ctx, session, body, token=f"token-of-{name}".ljust(32, "."))


def token_of(name: str) -> str:
    return f"token-of-{name}".ljust(32, ".")


async def test_a_pod_whose_version_moved_is_swapped_again_not_burned() -> None:
    """The hint is older than the pod (a status write since): the swap loses after the
    runtime took the token, and the pod — nobody else's — is swapped again from a fresh
    read (main burned it, and one start with a stale hint burned ATTEMPTS pods)."""
    kube, runtimes = FakeKube(), OnceRuntimes()
    async with httpx.AsyncClient(transport=httpx.MockTransport(runtimes)) as http:
        ctx = replica(kube, http, pool_pods(kube, 3))
        for i in range(3):  # each pod's version moves after the hint saw it
            await kube.patch(core_path(NS, "pods", f"pool-{i}") + "/status", {"status": {"x": 1}})
        claimed = await claim_for(ctx, "sb-session-a")
    assert claimed is not None and claimed["metadata"]["labels"][LABEL_POOL] == CLAIMED
    assert runtimes.tokens == {claimed["status"]["podIP"]: token_of("sb-session-a")}
    assert kube.verbs("delete") == []


async def test_a_pod_this_session_holds_already_is_kept_not_deleted() -> None:
    """Another replica's claim of this same session swapped the pod and delivered the
    token first: this claim's delivery repeats it (200), its swap loses — the pod serves
    the session through the first claim and is left alone: not deleted (d6b9587 deleted
    it under the session), not taken by this claim either (its status write, refused
    after the first one's, would delete it)."""
    kube, runtimes = FakeKube(), OnceRuntimes()
    async with httpx.AsyncClient(transport=httpx.MockTransport(runtimes)) as http:
        pods = pool_pods(kube, 1)
        first, second = replica(kube, http, pods), replica(kube, http, pods)
        one = await claim_for(first, "sb-session-a")
        two = await claim_for(second, "sb-session-a")
    assert one is not None and two is None  # no second pod either: the pool had one
    assert kube.verbs("delete") == []


async def test_two_replicas_racing_never_leave_a_pod_serving_another_sessions_token() -> None:
    """Two replicas with the same hint claim for 4 sessions each from 4 pods (10 seeds),
    deliveries and swaps interleaved at random: a pod given to a session holds that
    session's token and lives; a live claimed pod holds its own session's token or none;
    a free one holds none (deleting on every lost swap fails it at once)."""
    state = random.getstate()  # the module's generator: given back as it was
    try:
        for seed in range(10):
            random.seed(seed)
            await race_once(seed)
    finally:
        random.setstate(state)


async def race_once(seed: int) -> None:
    kube, runtimes = SlowKube(), OnceRuntimes(delay=0.003)
    async with httpx.AsyncClient(transport=httpx.MockTransport(runtimes)) as http:
        pods = pool_pods(kube, 4)
        replicas = [replica(kube, http, pods) for _ in range(2)]
        names = [f"sb-r{r}-{i}" for r in range(2) for i in range(4)]
        got = await asyncio.gather(*(claim_for(replicas[int(n[4])], n) for n in names))
    for name, pod in zip(names, got, strict=True):
        if pod is not None:
            assert runtimes.tokens[pod["status"]["podIP"]] == token_of(name), seed
            live = kube.objects[core_path(NS, "pods", pod["metadata"]["name"])]
            assert "deletionTimestamp" not in live["metadata"], seed
    for pod in kube.objects.values():
        meta, held = pod["metadata"], runtimes.tokens.get(pod["status"]["podIP"])
        if meta.get("deletionTimestamp") or held is None:
            continue
        assert meta["labels"][LABEL_POOL] == CLAIMED, seed
        assert held == token_of(meta["labels"]["sandboxworkspace.io/session"]), seed


# -- the workspace path the claim's answer names (issue 39) -------------------------------


async def kept_path(answer: object) -> tuple[bool, dict[str, str]]:
    """``deliver_token`` (no egress) answered ``answer``: (delivered, the paths the pool
    kept for the status write)."""
    state = PoolState((NS,), 1, PoolMetrics(CollectorRegistry()))
    reply = httpx.MockTransport(lambda request: httpx.Response(200, json=answer))
    async with httpx.AsyncClient(transport=reply) as http:
        ctx = SimpleNamespace(http=http, pool=state)
        delivered = await deliver_token(ctx, POD, "key", "token")  # type: ignore[arg-type]
    return delivered, state.workspace_paths


async def test_the_claim_answers_workspace_path_is_kept_for_the_status_write() -> None:
    answer = {"claimed": True, "network": "deny", "workspace_path": "/srv/node/ws"}
    assert await kept_path(answer) == (True, {"u1": "/srv/node/ws"})


_NO_PATH = object()


@pytest.mark.parametrize(
    "path",
    [
        pytest.param(_NO_PATH, id="none-named"),  # a runtime older than the field
        pytest.param("workspace", id="relative"),
        pytest.param("", id="empty"),
        pytest.param("/work\x00space", id="nul"),
        pytest.param("/" + "a" * 5000, id="huge"),
        pytest.param(7, id="number"),
        pytest.param(["/workspace"], id="list"),
        pytest.param({"path": "/workspace"}, id="object"),
        pytest.param(None, id="null"),
    ],
)
async def test_a_claim_answers_path_of_another_shape_is_not_kept(path: object) -> None:
    """The token was taken (a delivery), but the path is not recorded: the status then
    has none, and the operator's look and the API's fallback ask the runtime's stats."""
    answer: dict = {"claimed": True, "network": "deny"}
    if path is not _NO_PATH:
        answer["workspace_path"] = path
    assert await kept_path(answer) == (True, {})
    assert await kept_path(["not", "an", "object"]) == (True, {})


async def test_the_short_paths_status_write_names_the_claims_workspace_path() -> None:
    """A new session started from the pool (``handlers/pool_start.py``): its one status
    write is Running with the path the claim's answer named, and the pool keeps no copy."""
    from sandbox_workspace.operator.handlers.pool_start import start_from_pool

    kube = FakeKube()
    pod = kube.put(
        core_path(NS, "pods", "pool-1"),
        {
            "metadata": {"labels": {LABEL_POOL: FREE}},
            "status": {
                "phase": "Running",
                "podIP": "10.0.0.7",
                "conditions": [{"type": "Ready", "status": "True"}],
            },
        },
    )
    path = "/apis/sandboxworkspace.io/v1alpha1/namespaces/sessions/sandboxsessions/sb-session-a"
    body = kube.put(
        path,
        {
            "apiVersion": "sandboxworkspace.io/v1alpha1",
            "kind": "SandboxSession",
            "metadata": {"name": "sb-session-a"},
            "spec": {"userId": "a", "storage": {"persistent": False}},
        },
    )
    answer = {"claimed": True, "network": "deny", "workspace_path": "/srv/node/ws"}
    reply = httpx.MockTransport(lambda request: httpx.Response(200, json=answer))
    ctx = OperatorContext(OperatorSettings(_env_file=None), kube=kube)  # type: ignore[arg-type]
    ctx.pool = PoolState((NS,), 1, PoolMetrics(CollectorRegistry()))
    ctx.pool.keys[NS] = "claim-key"
    ctx.pool.note_free(NS, pod, ready=True)
    async with httpx.AsyncClient(transport=reply) as http:
        ctx.http = http
        try:
            assert await start_from_pool(ctx, body, resume=False)
        finally:
            for task in list(ctx.pool.posting):  # its Events wait for the claims to settle
                task.cancel()
    status = kube.objects[path]["status"]
    assert (status["phase"], status["podName"]) == ("Running", "pool-1")
    assert status["workspacePath"] == "/srv/node/ws"
    assert kube.verbs("patch").count(path + "/status") == 1
    assert ctx.pool.workspace_paths == {}


async def test_the_kept_paths_are_bounded_when_pods_go_unseen() -> None:
    """A path leaves with its status write or its pod's deletion event; pods whose
    deletion the watch missed (a re-list after a gap reports none) leave theirs behind —
    a pool that churns for weeks must not grow the map without end: the oldest go."""
    from sandbox_workspace.operator.pool.state import WORKSPACE_PATHS_MAX

    state = PoolState((NS,), 1, PoolMetrics(CollectorRegistry()))
    answer = {"claimed": True, "network": "deny", "workspace_path": "/workspace"}
    reply = httpx.MockTransport(lambda request: httpx.Response(200, json=answer))
    async with httpx.AsyncClient(transport=reply) as http:
        ctx = SimpleNamespace(http=http, pool=state)
        for n in range(WORKSPACE_PATHS_MAX + 50):
            pod = {**POD, "metadata": {"name": f"pool-{n}", "uid": f"u{n}"}}
            assert await deliver_token(ctx, pod, "key", "token")  # type: ignore[arg-type]
    assert len(state.workspace_paths) == WORKSPACE_PATHS_MAX
    assert "u0" not in state.workspace_paths  # the oldest went
    assert state.take_workspace_path(f"u{WORKSPACE_PATHS_MAX + 49}") == "/workspace"
