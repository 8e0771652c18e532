"""Many uploads and executions at once against one ``sandbox-workspace dev`` (local
backend): throughput, latency per operation, and zero lost or corrupted files.

A round is 200 operations (20 with --quick) spread over several users (one runtime
each) and conversations: half uploads of random bytes (4 KiB–1 MiB), a quarter Python
executions writing a 64 KiB payload to ``outputs/``, a quarter bash executions writing a
small text file. Every operation leaves one file whose SHA-256 the client knows. After
each round every file is downloaded through the API and hashed, and each conversation's
upload listing must hold exactly the uploads sent: a missing, extra or different file
fails the suite. Kernels are started before measuring (that cost is the execution
suite's "cold first call").

Baseline (same run): the same kind and number of operations, one at a time.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import random
import time
from dataclasses import dataclass

import httpx

from .harness import Figure, dev_server

API = "/api/v1/sessions"
LIMITS = {"max_file_size": 16, "max_file_size_unit": "MB", "allowed_file_types": []}


@dataclass
class Op:
    user: str
    conversation: str
    kind: str  # upload | python | bash
    name: str
    payload: bytes  # what the file must hold

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.payload).hexdigest()


def _python_payload(tag: str) -> bytes:
    """64 KiB both the client and the sandboxed code compute the same way."""
    return b"".join(hashlib.sha256(f"{tag}:{k}".encode()).digest() for k in range(2048))


def _ops(n: int, users: list[str], conversations: list[str], tag: str) -> list[Op]:
    rng = random.Random(tag)
    pairs = [(u, c) for c in conversations for u in users]
    ops = []
    for i in range(n):
        # Round-robin over (user, conversation); each pair gets the same mix of kinds.
        user, conversation = pairs[i % len(pairs)]
        kind = ("upload", "python", "upload", "bash")[(i // len(pairs) + i) % 4]
        name = f"{tag}-{i}.{'bin' if kind != 'bash' else 'txt'}"
        if kind == "upload":
            payload = os.urandom(rng.randint(4 * 1024, 1024 * 1024))
        elif kind == "python":
            payload = _python_payload(f"{tag}-{i}")
        else:
            payload = (f"bash {tag} {i} " * 64).encode()
        ops.append(Op(user, conversation, kind, name, payload))
    return ops


def _code(op: Op) -> dict:
    if op.kind == "python":
        stem = op.name.rsplit(".", 1)[0]  # the tag _python_payload was given
        code = (
            "import hashlib, os\n"
            f"data = b''.join(hashlib.sha256(f'{stem}:{{k}}'.encode()).digest()"
            " for k in range(2048))\n"
            "os.makedirs('outputs', exist_ok=True)\n"
            f"with open('outputs/{op.name}', 'wb') as f:\n"
            "    f.write(data)\n"
        )
    else:
        code = f"mkdir -p outputs && printf '%s' '{op.payload.decode()}' > outputs/{op.name}"
    return {
        "conversation_id": op.conversation,
        "language": op.kind,
        "code": code,
        "timeout": 120,
    }


async def _do(api: httpx.AsyncClient, op: Op) -> float:
    headers = {"X-User-Id": op.user}
    path = f"{API}/sb-session-{op.user}"
    start = time.perf_counter()
    if op.kind == "upload":
        r = await api.post(
            f"{path}/files/upload",
            headers=headers,
            files={"file": (op.name, op.payload)},
            data={"conversation_id": op.conversation},
        )
        ok = r.status_code == 201 and r.json()["sha256"] == op.sha256
    else:
        r = await api.post(f"{path}/execute", headers=headers, json=_code(op))
        ok = r.status_code == 200 and r.json()["exit_code"] == 0
    elapsed = (time.perf_counter() - start) * 1000
    if not ok:
        raise RuntimeError(f"{op.kind} {op.name} failed: {r.status_code} {r.text[:500]}")
    return elapsed


async def _verify(api: httpx.AsyncClient, ops: list[Op], roots: dict[str, str]) -> dict:
    """Download every file the round made; compare hashes and upload listings."""
    lost, corrupted, extra = [], [], []
    for op in ops:
        headers = {"X-User-Id": op.user}
        path = f"{API}/sb-session-{op.user}/files/"
        if op.kind == "upload":
            r = await api.get(
                path + op.name, headers=headers, params={"conversation_id": op.conversation}
            )
        else:
            r = await api.get(
                path + f"{roots[op.user]}/{op.conversation}/outputs/{op.name}", headers=headers
            )
        if r.status_code == 404:
            lost.append(op.name)
        elif r.status_code != 200 or hashlib.sha256(r.content).hexdigest() != op.sha256:
            corrupted.append(op.name)
    tag = ops[0].name.split("-", 1)[0]
    for user, conversation in {(op.user, op.conversation) for op in ops}:
        r = await api.get(
            f"{API}/sb-session-{user}/files",
            headers={"X-User-Id": user},
            params={"conversation_id": conversation},
        )
        listed = {name for name in r.json()["files"] if name.startswith(tag + "-")}
        sent = {
            op.name
            for op in ops
            if op.kind == "upload" and (op.user, op.conversation) == (user, conversation)
        }
        extra += sorted(listed - sent)
        lost += sorted(sent - listed - set(lost))
    if lost or corrupted or extra:
        raise AssertionError(f"lost {lost}, corrupted {corrupted}, unexpected {extra}")
    return {"checked": len(ops)}


async def _bench(url: str, n: int, rounds: int, users: list[str], conversations: list[str]):
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=n)
    async with httpx.AsyncClient(base_url=url, timeout=300, limits=limits) as api:
        roots = {}
        for user in users:
            r = await api.post(
                API, headers={"X-User-Id": user}, json={"config": {"file_upload_config": LIMITS}}
            )
            assert r.status_code == 201, r.text
            roots[user] = r.json()["workspace_path"].rstrip("/")
            for conversation in conversations:  # start each conversation's interpreter
                op = Op(user, conversation, "python", "warm.bin", _python_payload("warm"))
                await _do(api, op)
        par_rate, seq_rate, par_lat, seq_lat, checked = [], [], [], [], 0
        for r in range(rounds):
            ops = _ops(n, users, conversations, f"seq{r}")
            start = time.perf_counter()
            seq_lat += [await _do(api, op) for op in ops]
            seq_rate.append(n / (time.perf_counter() - start))
            checked += (await _verify(api, ops, roots))["checked"]

            ops = _ops(n, users, conversations, f"par{r}")
            start = time.perf_counter()
            par_lat += await asyncio.gather(*(_do(api, op) for op in ops))
            par_rate.append(n / (time.perf_counter() - start))
            checked += (await _verify(api, ops, roots))["checked"]
    return par_rate, seq_rate, par_lat, seq_lat, checked


def run(quick: bool) -> list[Figure]:
    n, rounds, n_users, n_conversations = (20, 1, 2, 2) if quick else (200, 3, 4, 5)
    users = [f"conc{u}" for u in range(n_users)]
    conversations = [f"c{c}" for c in range(n_conversations)]
    # A few users of one tenant make every operation: the per-user and per-tenant
    # execution caps must not throttle.
    with dev_server(
        SANDBOX_WORKSPACE_SANDBOX_MOUNT="none",
        SANDBOX_WORKSPACE_QUOTAS__EXECUTIONS_PER_USER="1000",
        SANDBOX_WORKSPACE_QUOTAS__EXECUTIONS_PER_TENANT="1000",
    ) as server:
        par_rate, seq_rate, par_lat, seq_lat, checked = asyncio.run(
            _bench(server.url, n, rounds, users, conversations)
        )
    where = {"users": n_users, "conversations_each": n_conversations, "rounds": rounds}
    return [
        Figure.of(
            f"{n} parallel uploads + executions (ops/s)",
            "ops/s",
            par_rate,
            "same ops one at a time",
            seq_rate,
            goal="0 lost / corrupted",
            files_sha256_checked=checked,
            lost=0,
            corrupted=0,
            **where,
        ),
        Figure.of(
            f"latency per op, {n} in flight (ms)",
            "ms",
            par_lat,
            "same ops one at a time",
            seq_lat,
            **where,
        ),
    ]
