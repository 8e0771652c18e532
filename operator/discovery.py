"""Waiting until the apiserver's discovery serves our resources, before kopf looks.

Why: kopf reads the apiserver's discovery (``/apis``, then ``/apis/{group}/{version}``)
once when it starts, and again only when a CRD changes. An operator that starts while the
apiserver is (re)starting — a control-plane upgrade, a crashed apiserver, the operator
rescheduled at the same moment — reads a discovery that does not list our group yet
(``503 … before all known HTTP paths have been installed``, or a list without it). kopf
then logs "Unresolved resources cannot be served" and handles nothing until it restarts:
in a fault trial a conversation's deletion waited more than 60 s, with its files on disk.

Contract: ``await wait_until_served(kube, wanted)`` returns once discovery lists every
plural of every group-version in ``wanted`` (``{"sandboxworkspace.io/v1alpha1":
("sandboxsessions", …)}``) the way kopf reads it. It retries every ``interval`` seconds
and says what is missing (a warning every ``report_every`` seconds), and it never gives
up: an operator without its CRDs cannot work, and a pod stuck here says so in its log.
``missing(kube, wanted)`` is one look: the ``group/version/plural`` names not served.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

log = logging.getLogger(__name__)


async def missing(kube: Any, wanted: Mapping[str, Sequence[str]]) -> list[str]:
    """What discovery does not serve yet (``kube``: a ``sandbox_workspace.kube.Kube``);
    an unreachable or failing apiserver serves nothing."""
    absent: list[str] = []
    try:
        groups = (await kube.get("/apis")) or {}
    except Exception as exc:  # the apiserver away or warming up: nothing is served
        return [f"{gv} ({type(exc).__name__})" for gv in wanted]
    listed = {
        f"{g.get('name')}/{v.get('version')}"
        for g in groups.get("groups") or []
        for v in g.get("versions") or []
    }
    for group_version, plurals in wanted.items():
        served: set[str] = set()
        if group_version in listed:
            try:
                resources = (await kube.get(f"/apis/{group_version}")) or {}
            except Exception:
                resources = {}
            served = {r.get("name") for r in resources.get("resources") or []}
        absent += [f"{group_version}/{p}" for p in plurals if p not in served]
    return absent


async def wait_until_served(
    kube: Any,
    wanted: Mapping[str, Sequence[str]],
    *,
    interval: float = 1.0,
    report_every: float = 10.0,
) -> None:
    reported = time.monotonic()
    while absent := await missing(kube, wanted):
        if time.monotonic() - reported >= report_every:
            reported = time.monotonic()
            log.warning(
                "waiting for the apiserver to serve our resources before handling any",
                extra={"missing": absent},
            )
        await asyncio.sleep(interval)
