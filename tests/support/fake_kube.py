"""A fake of the Kubernetes REST client (``sandbox_workspace/kube.Kube``) for unit tests.

It keeps objects by API path and speaks the verbs the handlers use with the apiserver's
semantics that matter to them: create-if-absent (None on a name taken), merge patch
(``None`` removes a key; ``…/status`` patches the status), delete with a uid
precondition, a new resourceVersion on every write (a patch naming another one is
refused: 409 ``KubeConflict``), and *graceful* deletion for the kinds that have it in a real
cluster (pods, claims: a deletionTimestamp first; ``finish`` removes them). Every
mutating call is recorded in ``calls``, every read in ``reads``. Injected through
``OperatorContext(kube=FakeKube())`` — the seam the operator already has (STYLE 12), no
monkey-patching.
"""

from __future__ import annotations

import copy
import itertools
from typing import Any

from sandbox_workspace.kube import KubeConflict

GRACEFUL = ("/pods/", "/persistentvolumeclaims/")
_uids = itertools.count(1)


def _merge(target: dict[str, Any], patch: dict[str, Any]) -> None:
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, dict) and isinstance(target.get(key), dict):
            _merge(target[key], value)
        else:
            target[key] = copy.deepcopy(value)


class FakeKube:
    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.calls: list[tuple[str, str]] = []
        self.reads: list[str] = []  # paths read with ``get``, in order
        self._versions = itertools.count(1)

    def _bump(self, obj: dict[str, Any]) -> None:
        # Every write makes a new resourceVersion, as the apiserver does.
        obj.setdefault("metadata", {})["resourceVersion"] = str(next(self._versions))

    # -- test helpers ---------------------------------------------------------------
    def put(self, path: str, obj: dict[str, Any]) -> dict[str, Any]:
        """Store ``obj`` at ``path`` as if it existed already (uid given if missing)."""
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {})
        meta.setdefault("name", path.rsplit("/", 1)[-1])
        meta.setdefault("uid", f"uid-{next(_uids)}")
        parts = path.split("/")
        if "namespaces" in parts:
            meta.setdefault("namespace", parts[parts.index("namespaces") + 1])
        self._bump(obj)
        self.objects[path] = obj
        return obj

    def finish(self, path: str) -> None:
        """A graceful deletion completes (the kubelet / the pvc-protection let go)."""
        self.objects.pop(path, None)

    def verbs(self, verb: str) -> list[str]:
        return [path for v, path in self.calls if v == verb]

    # -- the Kube interface -----------------------------------------------------------
    async def get(self, path: str) -> dict[str, Any] | None:
        self.reads.append(path)
        obj = self.objects.get(path)
        return copy.deepcopy(obj) if obj is not None else None

    async def list(self, path: str, label_selector: str | None = None) -> list[dict[str, Any]]:
        prefix = path.rstrip("/") + "/"
        return [
            copy.deepcopy(o)
            for p, o in self.objects.items()
            if p.startswith(prefix) and "/" not in p[len(prefix) :]
        ]

    async def create(self, path: str, body: dict[str, Any]) -> dict[str, Any] | None:
        name = body["metadata"]["name"]
        full = f"{path}/{name}"
        self.calls.append(("create", full))
        if full in self.objects:
            return None
        obj = copy.deepcopy(body)
        if "stringData" in obj:  # as the apiserver stores a Secret
            import base64

            obj["data"] = {
                k: base64.b64encode(v.encode()).decode() for k, v in obj.pop("stringData").items()
            }
        return copy.deepcopy(self.put(full, obj))

    async def request(self, method: str, path: str, body: Any = None, **_: Any) -> Any:
        """The API backend's create: POST raises ``Conflict`` on a name taken (as Kube)."""
        assert method == "POST", method
        obj = await self.create(path, body)
        if obj is None:
            raise KubeConflict(409, f"{path}/{body['metadata']['name']} exists", "AlreadyExists")
        return obj

    async def patch(self, path: str, body: dict[str, Any]) -> dict[str, Any] | None:
        self.calls.append(("patch", path))
        target_path = path.removesuffix("/status")
        obj = self.objects.get(target_path)
        if obj is None:
            return None
        wanted = (body.get("metadata") or {}).get("resourceVersion")
        if wanted is not None and wanted != obj["metadata"].get("resourceVersion"):
            raise KubeConflict(409, f"{path}: the object has been modified", "Conflict")
        if path.endswith("/status"):
            _merge(obj, {"status": body.get("status", {})})
        else:
            _merge(obj, {k: v for k, v in body.items() if k != "status"})
        self._bump(obj)
        return copy.deepcopy(obj)

    async def delete(self, path: str, uid: str | None = None) -> bool:
        self.calls.append(("delete", path))
        obj = self.objects.get(path)
        if obj is None or (uid and obj["metadata"].get("uid") != uid):
            return False
        if any(kind in path for kind in GRACEFUL):
            obj["metadata"].setdefault("deletionTimestamp", "2025-01-01T00:00:00Z")
        else:
            del self.objects[path]
        return True
