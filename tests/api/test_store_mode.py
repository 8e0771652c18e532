"""The API in ``SANDBOX_WORKSPACE_STORE=s3`` mode against a real SeaweedFS: it refuses to
start on a store it cannot use, with a message naming the setting to change."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.local_backend


def start_api(tmp_path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "sandbox_workspace", "dev", "--port", "0"],
        env={k: v for k, v in os.environ.items() if not k.startswith("SANDBOX_")} | env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_s3_mode_without_a_bucket_names_the_setting(tmp_path):
    done = start_api(tmp_path, SANDBOX_WORKSPACE_STORE="s3")
    assert done.returncode == 2
    assert "SANDBOX_WORKSPACE_S3__BUCKET" in done.stderr


def test_a_missing_bucket_stops_the_start(tmp_path, seaweedfs):
    done = start_api(tmp_path, **seaweedfs.env("no-such-bucket"))
    assert done.returncode == 2, done.stderr
    assert "does not exist" in done.stderr
    assert "SANDBOX_WORKSPACE_S3__BUCKET" in done.stderr


def test_bad_credentials_stop_the_start(tmp_path, seaweedfs, s3_bucket):
    env = seaweedfs.env(s3_bucket) | {"SANDBOX_WORKSPACE_S3__SECRET_ACCESS_KEY": "not-the-key"}
    done = start_api(tmp_path, **env)
    assert done.returncode == 2, done.stderr
    assert "SANDBOX_WORKSPACE_S3__SECRET_ACCESS_KEY" in done.stderr
