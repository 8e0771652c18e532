"""The image the kind tier deploys: ``SANDBOX_KIND_IMAGE`` when set (a prebuilt image);
else the product's image, built from the repository's own ``Dockerfile`` when there is
one; else ``tests/kind/Dockerfile``, built from a context of only what ``pip install .``
needs — never the repository's caches or virtualenv."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[3]
DOCKERFILE = Path(__file__).resolve().parents[1] / "Dockerfile"
SOURCES = ("pyproject.toml", "README.md", "sandbox_workspace", "api", "runtime", "operator")
DEFAULT_TAG = "sandbox-workspace:kind-test"


def image_for_kind() -> tuple[str, bool]:
    """(image reference, whether it was built here)."""
    given = os.environ.get("SANDBOX_KIND_IMAGE")
    if given:
        return given, False
    if (REPO_ROOT / "Dockerfile").is_file():
        subprocess.run(["docker", "build", "-t", DEFAULT_TAG, str(REPO_ROOT)], check=True)
        return DEFAULT_TAG, True
    with tempfile.TemporaryDirectory(prefix="sbw-kind-image-") as tmp:
        context = Path(tmp)
        for name in SOURCES:
            source = REPO_ROOT / name
            if source.is_dir():
                shutil.copytree(
                    source, context / name, ignore=shutil.ignore_patterns("__pycache__")
                )
            else:
                shutil.copy2(source, context / name)
        shutil.copy2(DOCKERFILE, context / "Dockerfile")
        subprocess.run(["docker", "build", "-t", DEFAULT_TAG, str(context)], check=True)
    return DEFAULT_TAG, True
