"""Helpers for tests that attack a runtime's disk: restart it, drop its privileges, and
check that it still does everything a user needs afterwards."""

from __future__ import annotations

import os
import shutil
import signal
import uuid

import pytest

# Executed code and the runtime run unprivileged in a pod; as root, mode 000 means
# nothing. setpriv removes the capabilities that bypass permission checks from the
# bounding set, so the exec'd runtime (uid 0 still) obeys modes like any user.
_DAC_CAPS = "-dac_override,-dac_read_search,-fowner"


def unprivileged_argv() -> list[str]:
    """Prefix that runs a command without permission-bypassing capabilities."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("running as root without setpriv (util-linux): cannot drop DAC capabilities")
    return [setpriv, f"--bounding-set={_DAC_CAPS}"]


def restart(runtime, sig: int = signal.SIGTERM) -> None:
    """Stop the runtime process (SIGKILL: no chance to tidy up) and start it again."""
    runtime.server.stop(sig)
    runtime.server.start()
    runtime.client.base_url = runtime.server.url


def make_unprivileged(runtime) -> None:
    """Restart the ``runtime`` fixture's process without DAC capabilities."""
    prefix = unprivileged_argv()
    if prefix and runtime.server.argv[: len(prefix)] != prefix:
        runtime.server.argv = [*prefix, *runtime.server.argv]
        restart(runtime)


def listed(runtime, cid: str) -> list[str]:
    r = runtime.client.get(f"/v1/conversations/{cid}/uploads")
    assert r.status_code == 200, r.text
    return [f["name"] for f in r.json()["files"]]


def execute(runtime, cid: str, code: str, language: str = "bash", timeout: float = 60) -> dict:
    r = runtime.client.post(
        f"/v1/conversations/{cid}/execute",
        json={"language": language, "code": code, "timeout": timeout},
        timeout=timeout + 30,
    )
    assert r.status_code == 200, r.text
    return r.json()


def assert_healthy(runtime, cid: str = "health-check") -> None:
    """Upload, list, download and execute all work in a fresh conversation."""
    name, data = f"h-{uuid.uuid4().hex[:6]}.txt", uuid.uuid4().bytes
    r = runtime.upload(cid, name, data)
    assert r.status_code == 201, r.text
    assert name in listed(runtime, cid)
    r = runtime.client.get(f"/v1/conversations/{cid}/uploads/{name}")
    assert r.status_code == 200 and r.content == data, r.text
    result = execute(runtime, cid, f"wc -c < uploads/temparea/{name}")
    assert result["exit_code"] == 0 and result["stdout"].strip() == str(len(data)), result


def fast_tmp_dir(fallback) -> str:
    """A fresh directory on tmpfs when there is one (creating 100,000 entries on a busy
    ext4 costs ~250 µs each, on tmpfs ~30 µs), else under ``fallback``. The code under
    test is filesystem-agnostic; only the set-up gets cheaper. The caller removes it."""
    import tempfile

    shm = "/dev/shm"
    base = shm if os.path.isdir(shm) and os.access(shm, os.W_OK) else str(fallback)
    return tempfile.mkdtemp(prefix="sbw-test-", dir=base)
