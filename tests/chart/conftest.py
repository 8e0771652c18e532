"""Fixtures of the chart tests: helm and kubeconform built from Go modules.

The tools are built (or found cached in .cache/tools) by the run's background prebuild
while the light tiers run (tests/support/prebuild.py); the first test that needs them
waits for it outside its timeout, and the ``tools`` fixture then finds them cached.
Without Go and without cached tools the tests are SKIPPED with that reason.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))

from build_scripts import find_go  # tests/support
from charttools import Tools, ToolsMissing, build_tools, tools_present, write_schemas

from sandbox_workspace.operator import crdgen

_state: dict[str, object] = {}
HERE = Path(__file__).resolve().parent
# The cluster tier's chart test needs the tools too; build them here for it as well.
USERS = (HERE, HERE.parent / "cluster" / "test_chart_rbac.py")


def _uses_tools(item: pytest.Item) -> bool:
    path = Path(str(item.path))
    return any(path == user or user in path.parents for user in USERS)


def _build(config: pytest.Config) -> None:
    if _state:
        return
    capman = config.pluginmanager.getplugin("capturemanager")
    cm = capman.global_and_fixture_disabled() if capman else contextlib.nullcontext()
    try:
        with cm:
            sys.stderr.write("\n[chart tests] helm + kubeconform (built once into .cache/tools)\n")
            _state["tools"] = build_tools(stream=sys.stderr)
    except ToolsMissing as exc:
        _state["skip"] = f"chart tests need helm and kubeconform, built with Go: {exc}"
    except Exception as exc:
        _state["error"] = f"building helm/kubeconform failed: {exc}"


def pytest_collection_finish(session: pytest.Session) -> None:
    items = [
        i
        for i in session.items
        if _uses_tools(i) and {"tools", "chart_tools"} & set(getattr(i, "fixturenames", ()))
    ]
    if not items or session.config.option.collectonly:
        return
    # The build itself: the run's background prebuild (tests/support/prebuild.py) while
    # the light tiers run, then the ``tools`` fixture (seconds: the tools are cached).
    if not tools_present() and find_go() is None:
        _state["skip"] = (
            "chart tests need helm and kubeconform, built with Go: no Go toolchain and no "
            "cached tools in .cache/tools"
        )
    if "skip" in _state:
        for item in items:
            item.add_marker(pytest.mark.skip(reason=str(_state["skip"])))


@pytest.fixture(scope="session")
def tools(request: pytest.FixtureRequest) -> Tools:
    _build(request.config)
    if "skip" in _state:
        pytest.skip(str(_state["skip"]))
    if "error" in _state:
        pytest.fail(str(_state["error"]), pytrace=False)
    return _state["tools"]  # type: ignore[return-value]


@pytest.fixture(scope="session")
def schema_dir(tools: Tools, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """kubeconform schemas: built-in kinds from the OpenAPI document, our custom
    resources from the models, kopf's peering resource from the chart's CRD, and the
    monitoring.coreos.com kinds from tests/chart/monitoring-crds.yaml."""
    crds = [crdgen.build_crd(kind) for kind in crdgen.KINDS]
    peering = HERE.parents[1] / "charts" / "sandbox-workspace" / "crds" / "kopf-peering.yaml"
    crds += [doc for doc in yaml.safe_load_all(peering.read_text()) if doc]
    # The Prometheus Operator's kinds the chart's monitoring values render (a subset).
    crds += [doc for doc in yaml.safe_load_all((HERE / "monitoring-crds.yaml").read_text()) if doc]
    yield write_schemas(tools, tmp_path_factory.mktemp("schemas"), crds)
