"""The operator's discovery gate (operator/discovery.py) against a real apiserver: it
waits while discovery does not serve a resource and returns once a new CRD is served.

Why it matters: kopf reads discovery once at start; an operator started while the
apiserver warmed up served nothing for over a minute in a fault trial (the quick fault
bench's 'apiserver restarted' trials hold the whole operator to it).
"""

from __future__ import annotations

import asyncio
import dataclasses
import secrets

import pytest

from sandbox_workspace.kube import Kube, load_credentials
from sandbox_workspace.operator import discovery
from sandbox_workspace.operator.handlers.startup import served_resources

pytestmark = pytest.mark.cluster

CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"


def widget_crd(group: str) -> dict:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"widgets.{group}"},
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": {"type": "object"}},
                }
            ],
        },
    }


def test_the_gate_waits_for_a_resource_discovery_does_not_serve_yet(kube_control_plane, kube_api):
    group = f"t{secrets.token_hex(4)}.example.com"
    wanted = {f"{group}/v1": ("widgets",)}

    async def scenario() -> None:
        kube = Kube(load_credentials(kube_control_plane.kubeconfig))
        try:
            # Our own CRDs are installed here: nothing of the operator's is missing.
            assert await discovery.missing(kube, served_resources(True, False)) == []
            assert await discovery.missing(kube, wanted) == [f"{group}/v1/widgets"]
            # Still not served: the gate does not return (bounded by a timeout).
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(discovery.wait_until_served(kube, wanted, interval=0.1), 1)
            await asyncio.to_thread(kube_api.create, CRDS, widget_crd(group))
            await asyncio.wait_for(discovery.wait_until_served(kube, wanted, interval=0.1), 60)
            assert await discovery.missing(kube, wanted) == []
        finally:
            await kube.aclose()

    try:
        asyncio.run(scenario())
    finally:
        kube_api.delete(f"{CRDS}/widgets.{group}")


def test_an_unreachable_apiserver_serves_nothing(kube_control_plane):
    """An apiserver that is not there is a missing resource, not an error that would end
    the operator's start."""
    credentials = load_credentials(kube_control_plane.kubeconfig)
    closed = dataclasses.replace(credentials, server="https://127.0.0.1:1")

    async def scenario() -> list[str]:
        kube = Kube(closed)
        try:
            return await discovery.missing(kube, served_resources(False, True))
        finally:
            await kube.aclose()

    absent = asyncio.run(scenario())
    assert len(absent) == 2 and all("Unreachable" in a for a in absent), absent
