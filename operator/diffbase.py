"""kopf's diff base (the last-handled configuration) of our resources, in an annotation
under our prefix — except for a new session the warm pool's short path started.

Contract: as ``kopf.AnnotationsDiffBaseStorage``, plus, for SandboxSessions only:

- ``store`` writes nothing for a session whose uid ``skip(uid)`` answers True for (asked
  once per store): a new session started by the short path (``handlers/pool_start.py``),
  whose one status write already says it was handled at its spec. kopf's own write of the
  annotation would be a second write and a second watch event per start, the apiserver's
  and the operator's work a burst of claims waits behind (issue 25). Its handler's
  progress is not stored either (``SessionProgressStorage``, asking ``started(uid)``,
  which does not consume the answer): kopf stores a success record, then purges it, but
  the storage's ``kopf-managed`` marker it adds on the way would be that write again.
- ``fetch`` of a session with no annotation whose ``status.observedGeneration`` equals
  its ``metadata.generation``, and with no handler of ``RECONCILE`` in flight (no kopf
  progress record: a retry after a status write is kopf's to finish), answers the
  session's own essence: it was handled at this spec, so kopf sees no change (its events
  are no creation; an operator restart resumes it as any other). A session with no
  annotation and a newer generation has no diff base: kopf calls its creation handler,
  whose reconcile handles it as the spec update it is (only a session without a status
  takes the short path), and then stores the annotation.

Our handlers read only ``spec`` (field ``spec`` for updates), so an essence taken from the
session itself loses nothing: a change of labels or annotations calls no handler either way.

``build`` gives kopf's essence of any object (equal to kopf's own) without deep-copying
what the essence drops — status and metadata besides labels, annotations and owners
(``managedFields`` above all): kopf builds one on every watch event of every resource we
handle, the sandbox pods' included, and copying whole bodies was ~7% of the operator's
work in a burst of claims (py-spy).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import kopf

from sandbox_workspace.contract.crd import SESSION_KIND

KEY = "last-handled-configuration"
# The sessions' change handlers (handlers/__init__.py): create and resume, and update of
# the spec (kopf suffixes the field).
RECONCILE = "reconcile"
_HANDLERS = (kopf.HandlerId(RECONCILE), kopf.HandlerId(f"{RECONCILE}/spec"))
# What kopf's essence keeps of metadata (labels, annotations) and what its storage keys
# look at (owners).
_ESSENTIAL_META = ("labels", "annotations", "ownerReferences")


class SessionDiffBaseStorage(kopf.AnnotationsDiffBaseStorage):
    """``kopf.AnnotationsDiffBaseStorage(prefix=…, key=KEY)`` with the module's two rules;
    ``progress``: the storage of kopf's handler progress (what says one is in flight)."""

    def __init__(
        self, *, prefix: str, skip: Callable[[str], bool], progress: kopf.ProgressStorage
    ) -> None:
        super().__init__(prefix=prefix, key=KEY)
        self._skip = skip
        self._progress = progress

    def build(
        self, *, body: kopf.Body, extra_fields: Iterable[Any] | None = None
    ) -> kopf.BodyEssence:
        extra = list(extra_fields or ())
        if extra:  # fields kopf restores from anywhere in the body: the whole of it
            return super().build(body=body, extra_fields=extra)
        meta = body.get("metadata") or {}
        light = {k: v for k, v in body.items() if k not in ("metadata", "status")}
        light["metadata"] = {k: meta[k] for k in _ESSENTIAL_META if k in meta}
        return super().build(body=kopf.Body(light))

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        stored = super().fetch(body=body)
        if stored is not None or body.get("kind") != SESSION_KIND:
            return stored
        generation = body.metadata.get("generation")
        if generation is None or body.status.get("observedGeneration") != generation:
            return None
        if any(self._progress.fetch(key=h, body=body) is not None for h in _HANDLERS):
            return None
        return self.build(body=body)

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        if body.get("kind") == SESSION_KIND and self._skip(body.metadata.uid or ""):
            return
        super().store(body=body, patch=patch, essence=essence)


class SessionProgressStorage(kopf.AnnotationsProgressStorage):
    """``kopf.AnnotationsProgressStorage(prefix=…)`` that stores nothing for a session
    ``started(uid)`` names (the module contract: its one handler succeeded)."""

    def __init__(self, *, prefix: str, started: Callable[[str], bool]) -> None:
        super().__init__(prefix=prefix)
        self._started = started

    def store(
        self,
        *,
        key: kopf.HandlerId,
        record: kopf.ProgressRecord,
        body: kopf.Body,
        patch: kopf.Patch,
    ) -> None:
        if body.get("kind") == SESSION_KIND and self._started(body.metadata.uid or ""):
            return
        super().store(key=key, record=record, body=body, patch=patch)
