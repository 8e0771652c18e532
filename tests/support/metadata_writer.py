"""One writer process of tests/store/test_metadata.py: ``ROUNDS`` times, change the
shared file ``outputs/same.txt`` and add a file of its own, in conversation ``shared``.

Usage: metadata_writer.py dir|s3 CONFIG_JSON NAME ROUNDS (CONFIG: a directory, or
S3Settings values).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

from sandbox_workspace.store import DirStore, S3Settings, S3Store
from sandbox_workspace.store.layout import Layout, Scope
from sandbox_workspace.store.metadata import Metadata, Written


async def main(kind: str, config, me: str, rounds: int) -> None:
    store = S3Store(S3Settings(**config)) if kind == "s3" else DirStore(Path(config))
    meta = Metadata(store, Layout("workspaces/"))
    scope = Scope("t", "sb-session-x")
    for i in range(rounds):
        shared = Written("outputs/same.txt", 1, f"{me}-{i}", "text/plain")
        await meta.record_write(scope, "shared", shared, uploaded=False)
        own = Written(f"outputs/{me}-{i}.txt", 1, "h", "text/plain")
        await meta.record_write(scope, "shared", own, uploaded=False)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], json.loads(sys.argv[2]), sys.argv[3], int(sys.argv[4])))
    # Out without the interpreter's finalisation: the S3 client's Rust runtime may still
    # hold a callback into the closed event loop and abort it (SIGABRT, exit -6, seen once
    # in a fresh-clone run after every write had succeeded). What the test checks — the
    # document in the store — is written by now.
    sys.stdout.flush()
    os._exit(0)
