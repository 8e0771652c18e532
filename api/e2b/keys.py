"""E2B API keys in ``required`` auth mode: issued per user, stored hashed, revocable.

Contract:
- A key is ``e2b_`` + 40 hex characters (E2B's form). It belongs to one (tenant, user):
  the caller of ``POST /e2b/keys`` — a user with their own JWT, or the platform acting
  for a user with its service token and ``X-User-Id``/``X-Tenant-Id``. The plain key is
  in that one answer only.
- What is stored is ``sha256(key)`` → ``{id, tenant, user, created}``, never the key:
  a key is 160 random bits, so an unsalted fast hash is enough (nothing to brute-force),
  and it lets a request find its record by one lookup.
- ``DELETE /e2b/keys/{id}`` revokes (removes the record); the owner alone sees and
  revokes their keys (another user's key id is 404).
- Where: the one persistence both backends have without extra services. The kubernetes
  backend keeps the records in one Secret (``sandbox-workspace-e2b-keys`` in the API's
  namespace: RBAC-guarded, shared by every replica, updated with ``resourceVersion`` so
  two replicas issuing at once do not lose a key); the local backend in
  ``{data_dir}/e2b-keys.json`` (mode 0600, replaced atomically). The run store (Redis) is
  optional and the object store is off by default, so neither could hold them always.
  A replica reads the Secret at most every ``CACHE_SECONDS``: a key revoked on another
  replica stops working there within that time (on the revoking replica at once).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import os
import secrets
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, Protocol

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response

from sandbox_workspace.contract.errors import NotFoundError

from ..deps import Services, ServicesDep, get_caller
from ..identity import Caller

SECRET_NAME = "sandbox-workspace-e2b-keys"
CACHE_SECONDS = 5.0
MAX_KEYS_PER_USER = 20


def key_hash(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


class Records(Protocol):
    """hash → record, read whole and written whole (a few hundred keys at most)."""

    async def read(self) -> dict[str, dict[str, Any]]: ...

    async def update(self, change) -> None:
        """Apply ``change(records)`` (mutating) and store the result."""


class FileRecords:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = asyncio.Lock()

    async def read(self) -> dict[str, dict[str, Any]]:
        try:
            return json.loads(self.path.read_text())
        except FileNotFoundError:
            return {}

    async def update(self, change) -> None:
        async with self._lock:
            records = await self.read()
            change(records)
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(".tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                json.dump(records, f)
            os.replace(tmp, self.path)


class SecretRecords:
    """One Secret whose ``data`` maps each key hash to its record (base64 JSON)."""

    def __init__(self, kube, namespace: str) -> None:
        from sandbox_workspace.kube import core_path

        self.kube = kube
        self.path = core_path(namespace, "secrets", SECRET_NAME)
        self.create_path = core_path(namespace, "secrets")
        self._cached: tuple[float, dict[str, dict[str, Any]]] | None = None

    async def _get(self) -> tuple[dict | None, dict[str, dict[str, Any]]]:
        obj = await self.kube.get(self.path)
        data = (obj or {}).get("data") or {}
        records = {h: json.loads(base64.b64decode(v)) for h, v in data.items()}
        self._cached = (time.monotonic(), records)
        return obj, records

    async def read(self) -> dict[str, dict[str, Any]]:
        if self._cached and time.monotonic() - self._cached[0] < CACHE_SECONDS:
            return self._cached[1]
        return (await self._get())[1]

    async def update(self, change) -> None:
        from sandbox_workspace.kube import KubeConflict

        for _ in range(10):  # optimistic concurrency: retry on another replica's write
            obj, records = await self._get()
            before = set(records)
            change(records)
            data: dict[str, str | None] = {
                h: base64.b64encode(json.dumps(r).encode()).decode() for h, r in records.items()
            }
            data |= dict.fromkeys(before - set(records))  # merge patch: None removes
            try:
                if obj is None:
                    meta = {"name": SECRET_NAME}
                    body = {"apiVersion": "v1", "kind": "Secret", "type": "Opaque"}
                    done = await self.kube.create(
                        self.create_path, {**body, "metadata": meta, "data": data}
                    )
                else:  # the resourceVersion makes the apiserver refuse a stale write
                    version = obj["metadata"]["resourceVersion"]
                    done = await self.kube.patch(
                        self.path, {"metadata": {"resourceVersion": version}, "data": data}
                    )
            except KubeConflict:
                continue
            if done is not None:  # None: created or deleted by another replica meanwhile
                self._cached = (time.monotonic(), records)
                return
        raise RuntimeError("the E2B key Secret kept changing under us")


def records_of(request: Request, services: Services) -> Records:
    """The app's one key store (made on first use)."""
    store = getattr(request.app.state, "e2b_keys", None)
    if store is None:
        backend = services.backend
        if hasattr(backend, "kube"):
            store = SecretRecords(backend.kube, backend.namespace)
        else:
            store = FileRecords(Path(services.settings.data_dir) / "e2b-keys.json")
        request.app.state.e2b_keys = store
    return store


async def owner_of(records: Records, key: str) -> Caller | None:
    record = (await records.read()).get(key_hash(key))
    if record is None:
        return None
    return Caller(record["user"], "e2b-key", record["tenant"])


class KeyNotFound(NotFoundError):
    code = "key_not_found"


router = APIRouter(prefix="/keys", tags=["e2b"], include_in_schema=False)  # under /e2b
CallerDep = Annotated[Caller, Depends(get_caller)]


def _mine(records: dict, caller: Caller) -> dict[str, dict[str, Any]]:
    return {
        h: r
        for h, r in records.items()
        if r["tenant"] == caller.tenant and r["user"] == caller.user_id
    }


@router.post("")
async def issue_key(request: Request, services: ServicesDep, caller: CallerDep) -> Response:
    """A new key for the caller; the plain key is in this answer only."""
    key = "e2b_" + secrets.token_hex(20)
    record = {
        "id": secrets.token_hex(8),
        "tenant": caller.tenant,
        "user": caller.user_id,
        "created": datetime.now(UTC).isoformat(),
    }
    store = records_of(request, services)
    too_many = False

    def add(records: dict) -> None:
        nonlocal too_many
        too_many = len(_mine(records, caller)) >= MAX_KEYS_PER_USER
        if not too_many:
            records[key_hash(key)] = record

    await store.update(add)
    if too_many:
        return JSONResponse(
            {
                "code": 409,
                "message": f"at most {MAX_KEYS_PER_USER} E2B keys per user: revoke one "
                "(DELETE /e2b/keys/{id})",
            },
            status_code=409,
        )
    return JSONResponse({**record, "key": key}, status_code=201)


@router.get("")
async def list_keys(request: Request, services: ServicesDep, caller: CallerDep) -> Response:
    records = await records_of(request, services).read()
    return JSONResponse(sorted(_mine(records, caller).values(), key=lambda r: r["created"]))


@router.delete("/{key_id}")
async def revoke_key(
    key_id: str, request: Request, services: ServicesDep, caller: CallerDep
) -> Response:
    found = False

    def drop(records: dict) -> None:
        nonlocal found
        for h, r in list(_mine(records, caller).items()):
            if r["id"] == key_id:
                del records[h]
                found = True

    await records_of(request, services).update(drop)
    if not found:
        e = KeyNotFound(f"E2B key '{key_id}' not found")
        return JSONResponse({"code": 404, "message": e.message}, status_code=404)
    return Response(status_code=204)
