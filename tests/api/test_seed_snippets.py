"""Seed 000 §6's frontend snippets, as written, against the live API (in Node).

tests/api/seed/snippets.mjs holds the seed's four functions with only their TypeScript
type annotations removed, called the way the seed's usage examples call them: upload with
FormData (twice, §6.1 and §6.2), list with the underscored ``conversation_id`` header
(§6.3), download by bare file name with no conversation at all (§6.4).

The snippets send no credentials (in production a gateway or cookie carries them); in
``dev`` mode such a request is the user ``dev``, so that is the user they speak for.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

SNIPPETS = Path(__file__).parent / "seed" / "snippets.mjs"


def node_version(node: str) -> int:
    out = subprocess.run([node, "--version"], capture_output=True, text=True, check=True).stdout
    return int(out.strip().lstrip("v").split(".")[0])


@pytest.fixture(scope="module")
def node() -> str:
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed (scripts/install-system-deps.sh installs nodejs)")
    if node_version(node) < 18:
        pytest.skip("node 18+ is needed (fetch, FormData, Blob)")
    return node


@pytest.fixture
def dev_user(dev_server) -> Iterator[tuple[httpx.Client, str]]:
    """The ``dev`` user's client and a conversation of its own, deleted afterwards."""
    cid = f"conv-{uuid.uuid4().hex[:8]}"
    with httpx.Client(base_url=dev_server.url, timeout=60) as client:
        yield client, cid
        client.delete(f"/api/v1/sessions/sb-session-dev/conversations/{cid}")


def test_seed_frontend_snippets_work_verbatim(node, dev_server, dev_user):
    client, cid = dev_user
    result = subprocess.run(
        [node, str(SNIPPETS), dev_server.url, "dev", cid],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["first"]["name"] == "model.csv", out["first"]
    # §8.6: the frontend builds selected_files from the upload answer's file_name.
    assert (out["first"]["file_name"], out["uploaded"]["file_name"]) == ("model.csv", "data.csv")
    assert out["uploaded"]["path"].endswith(f"/{cid}/uploads/temparea/data.csv")
    assert out["uploaded"]["session_id"] == "sb-session-dev"
    assert out["listed"] == ["data.csv", "model.csv"]
    assert out["downloaded"] == "a,b\n3,4\n"
    # The same files, seen through the API directly.
    listing = client.get("/api/v1/sessions/sb-session-dev/files", params={"conversation_id": cid})
    assert sorted(listing.json()["files"]) == ["data.csv", "model.csv"]
