"""Fixtures of the image smoke tests: the project's image, built with podman.

The run's background prebuild (tests/support/prebuild.py, outside any test timeout)
builds the image while the light tiers run; the ``image`` fixture then runs
``scripts/build-image.sh --no-smoke`` again, which finds it built (seconds). It builds
the image — the Debian base with debootstrap the first time, then the Dockerfile, which
podman's layer cache makes quick when only the code changed. The tests are SKIPPED with
the reason when podman is not usable here (not installed, no runc, not root...) or when
SANDBOX_SKIP_IMAGE=1.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "build-image.sh"
IMAGE = os.environ.get("SANDBOX_TEST_IMAGE", "localhost/sandbox-workspace:test")
HERE = Path(__file__).resolve().parent
_state: dict[str, str] = {}


def podman_command() -> list[str]:
    """podman with runc (crun fails on cgroup v1 hybrid hosts) — as the script runs it."""
    runc = Path("/usr/sbin/runc")
    return ["podman", "--runtime", str(runc)] if runc.exists() else ["podman"]


def _check() -> None:
    """Whether podman can build here (``_state["skip"]`` says why not); seconds."""
    if _state:
        return
    if os.environ.get("SANDBOX_SKIP_IMAGE", "") not in ("", "0"):
        _state["skip"] = "SANDBOX_SKIP_IMAGE is set: image tests disabled"
        return
    check = subprocess.run(["bash", str(SCRIPT), "--check"], capture_output=True, text=True)
    if check.returncode != 0:
        _state["skip"] = f"podman is not usable here: {check.stdout.strip() or check.stderr}"
        return
    _state["usable"] = "1"


def _prepare(config: pytest.Config) -> None:
    _check()
    if "usable" not in _state or "image" in _state or "error" in _state:
        return
    capman = config.pluginmanager.getplugin("capturemanager")
    cm = capman.global_and_fixture_disabled() if capman else contextlib.nullcontext()
    with cm:
        sys.stderr.write(
            f"\n[image tests] building {IMAGE} with scripts/build-image.sh "
            "(first time ~90 s, then seconds)\n"
        )
        started = time.monotonic()
        build = subprocess.run(
            ["bash", str(SCRIPT), "--no-smoke"],
            env={**os.environ, "IMAGE": IMAGE},
            capture_output=True,
            text=True,
        )
        # podman's step-by-step output only when something went wrong.
        lines = build.stderr.splitlines()
        shown = lines[-40:] if build.returncode else [ln for ln in lines if "[build-image" in ln]
        sys.stderr.write("\n".join(shown) + f"\n[image tests] {time.monotonic() - started:.0f} s\n")
    if build.returncode == 3:
        _state["skip"] = "the image cannot be built here (see the build output above)"
    elif build.returncode != 0:
        _state["error"] = f"scripts/build-image.sh failed (exit {build.returncode})"
    else:
        _state["image"] = IMAGE


def pytest_collection_finish(session: pytest.Session) -> None:
    items = [i for i in session.items if HERE in Path(str(i.path)).parents]
    if not items or session.config.option.collectonly:
        return
    _check()  # the build itself: the run's background prebuild, then the fixture (seconds)
    if "skip" in _state:
        for item in items:
            item.add_marker(pytest.mark.skip(reason=_state["skip"]))


@pytest.fixture(scope="session")
def image(request: pytest.FixtureRequest) -> str:
    _prepare(request.config)
    if "skip" in _state:
        pytest.skip(_state["skip"])
    if "error" in _state:
        pytest.fail(_state["error"], pytrace=False)
    return _state["image"]


@pytest.fixture(scope="session")
def podman() -> list[str]:
    return podman_command()
