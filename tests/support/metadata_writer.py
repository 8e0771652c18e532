"""One writer process of tests/store/test_metadata.py: ``ROUNDS`` times, change the
shared file ``outputs/same.txt`` and add a file of its own, in conversation ``shared``.

Usage: metadata_writer.py dir|s3 CONFIG_JSON NAME ROUNDS (CONFIG: a directory, or
S3Settings values).
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

from sandbox_workspace.store import DirStore, S3Settings, S3Store
from sandbox_workspace.store.layout import Layout, Scope
from sandbox_workspace.store.metadata import Metadata, Written


async def main(kind: str, config, me: str, rounds: int) -> None:
    store = S3Store(S3Settings(**config)) if kind == "s3" else DirStore(Path(config))
    meta = Metadata(store, Layout("workspaces/"))
    scope = Scope("t", "sb-session-x")
    try:
        for i in range(rounds):
            shared = Written("outputs/same.txt", 1, f"{me}-{i}", "text/plain")
            await meta.record_write(scope, "shared", shared, uploaded=False)
            own = Written(f"outputs/{me}-{i}.txt", 1, "h", "text/plain")
            await meta.record_write(scope, "shared", own, uploaded=False)
    finally:
        await store.aclose()  # before the loop closes: see S3Store.aclose


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], json.loads(sys.argv[2]), sys.argv[3], int(sys.argv[4])))
