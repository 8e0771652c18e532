"""The start-up messages of sandbox_workspace/startup.py."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from sandbox_workspace import startup


@pytest.mark.parametrize(
    ("host", "url"),
    [
        ("127.0.0.1", "http://127.0.0.1:8000"),
        ("localhost", "http://localhost:8000"),
        ("::1", "http://[::1]:8000"),
    ],
)
def test_url_is_valid_for_ipv6_too(host, url):
    assert startup.url(host, 8000) == url


def test_banner_uses_the_url_as_given(tmp_path: Path):
    text = startup.dev_banner("http://[::1]:8000", tmp_path, web_ui=False)
    assert "curl -s 'http://[::1]:8000/api/v1/sessions/sb-session-dev/files?" in text
    assert "page:" not in text and "docs:   http://[::1]:8000/docs" in text


def test_dev_names_only_the_settings_it_overrides():
    env = {
        "SANDBOX_WORKSPACE_AUTH_MODE": "required",
        "SANDBOX_WORKSPACE_BACKEND": "local",  # what dev does anyway: nothing to say
        "SANDBOX_WORKSPACE_LOG_FORMAT": "json",  # honoured by dev
    }
    [notice] = startup.dev_notices(env)
    assert notice.startswith("sandbox-workspace dev: ignoring SANDBOX_WORKSPACE_AUTH_MODE")
    assert startup.dev_notices({"SANDBOX_WORKSPACE_BACKEND": "kubernetes"})


def test_listen_error_is_only_for_addresses():
    busy = OSError(errno.EADDRINUSE, "Address already in use")
    assert "the port is in use" in startup.listen_error(busy, "::1", 80)
    assert "http://[::1]:80" in startup.listen_error(busy, "::1", 80)
    assert startup.listen_error(OSError(errno.EIO, "I/O"), "127.0.0.1", 80) is None
    # A file's EACCES (a mounted key the user cannot read) is not the port's.
    unreadable = PermissionError(errno.EACCES, "Permission denied", "/etc/ca/tls.key")
    assert startup.listen_error(unreadable, "0.0.0.0", 3128) is None
