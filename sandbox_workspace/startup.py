"""What the command line says when a server starts, or cannot: pure functions of the
settings, the environment and the error, so each message is tested on its own.

Contract:
- ``url(host, port)``: the address a browser or curl takes (IPv6 in brackets).
- ``dev_banner(url, data_dir, web_ui)``: dev's start-up lines; every command in them
  works on a fresh data directory.
- ``dev_notices(environ)``: one line per setting ``dev`` overrides (it always serves the
  local backend without authentication), so nobody believes it applies.
- ``settings_source_error(e, prefix, environ)``: the one line for a setting that is not
  the JSON its type needs (a list written ``a,b``): the variable and the form to use.
- ``listen_error(e, host, port)``: the one line for an address that cannot be listened
  on (in use, not this machine's, privileged), or None for any other ``OSError``.
"""

from __future__ import annotations

import errno
import re
from collections.abc import Mapping
from pathlib import Path

_DEV_OVERRIDES = {
    "AUTH_MODE": "dev has no authentication (the user is X-User-Id); use "
    "`sandbox-workspace api` for required auth",
    "BACKEND": "dev always uses the local backend; use `sandbox-workspace api` for kubernetes",
}


def url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def dev_banner(base: str, data_dir: Path, web_ui: bool) -> str:
    lines = [
        f"Sandbox Workspace (local backend, dev auth) on {base}",
        f"  data:   {data_dir.resolve()}",
        # A read that works on a fresh start: file operations start the session.
        f"  try:    curl -s '{base}/api/v1/sessions/sb-session-dev/files?conversation_id=hello'"
        " -H 'X-User-Id: dev'",
    ]
    if web_ui:
        lines.append(f"  page:   {base}/ui/")
    lines += [f"  docs:   {base}/docs", "  stop:   Ctrl-C"]
    return "\n".join(lines)


def dev_notices(environ: Mapping[str, str], prefix: str = "SANDBOX_WORKSPACE_") -> list[str]:
    notices = []
    for name, why in _DEV_OVERRIDES.items():
        value = environ.get(prefix + name)
        if value and value != {"AUTH_MODE": "dev", "BACKEND": "local"}[name]:
            notices.append(f"sandbox-workspace dev: ignoring {prefix}{name}={value}: {why}")
    return notices


def settings_source_error(e: Exception, prefix: str, environ: Mapping[str, str]) -> str:
    """``e``: pydantic-settings' SettingsError (a value it could not decode)."""
    match = re.search(r'field "(\w+)"', str(e))
    field = match.group(1).upper() if match else ""
    names = sorted(
        k
        for k in environ
        if field and (k.upper() == prefix + field or k.upper().startswith(f"{prefix}{field}__"))
    )
    name = ", ".join(names) or f"{prefix}{field or '…'}"
    cause = f" ({e.__cause__})" if e.__cause__ else ""
    return (
        f"sandbox-workspace: invalid setting {name}: not valid JSON{cause}; list and map "
        'settings are JSON, e.g. \'["https://app.example.com"]\' or \'["csv", "txt"]\''
    )


def listen_error(e: OSError, host: str, port: int) -> str | None:
    if e.filename is not None:
        # A file the server reads at start (the egress proxy's CA key, unreadable for its
        # user): the error names it; never "ports below 1024 need privileges".
        return None
    why = {
        errno.EADDRINUSE: "the port is in use (another server? stop it, or choose another "
        "port: --port, or PORT= with make dev)",
        errno.EADDRNOTAVAIL: "the address is not one of this machine's (--host)",
        errno.EACCES: "permission denied (ports below 1024 need privileges: choose another)",
    }.get(e.errno or 0)
    if why is None:
        return None
    return f"sandbox-workspace: cannot listen on {url(host, port)}: {why}"
