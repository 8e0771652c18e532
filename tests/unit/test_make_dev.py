"""`make dev` installs what serving needs, not the test toolchain (issue 41): its stamp
installs the package with the `sandbox` extra only, and serving imports nothing of `dev`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# Top-level modules of the `dev` extra that no server may need.
TEST_TOOLCHAIN = {"pytest", "pytest_kind", "schemathesis", "playwright", "joblib", "ruff"}


def test_make_dev_installs_the_serving_extras_only(tmp_path: Path):
    plan = subprocess.run(
        ["make", "-n", "dev", f"VENV={tmp_path / 'venv'}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "pip install --quiet -e '.[sandbox]'" in plan, plan
    assert ".[dev]" not in plan, plan


def test_serving_imports_nothing_of_the_test_toolchain():
    probe = (
        "import sys\n"
        "import sandbox_workspace.cli, sandbox_workspace.api.app, sandbox_workspace.runtime.app\n"
        "print(' '.join(sorted({m.split('.')[0] for m in sys.modules})))"
    )
    loaded = set(
        subprocess.run(
            [sys.executable, "-c", probe], capture_output=True, text=True, check=True
        ).stdout.split()
    )
    assert not loaded & TEST_TOOLCHAIN
