"""Spike for issue 40 (docs/egress-spike.md), item (b): a session's code in its own network
namespace (the local backend's bwrap invocation plus ``--unshare-net``) whose only way out
is the relay to the egress proxy's per-session Unix socket. ``pip install`` from an index
the policy allows succeeds; from another index it fails with the proxy's reason; a direct
connection to the host's loopback fails (the namespace has its own).

    python scripts/spikes/egress_netns.py

Everything is on 127.0.0.1 of this machine or inside the namespace bwrap makes.
"""

from __future__ import annotations

import asyncio
import http.server
import ipaddress
import subprocess
import sys
import tempfile
import threading
import time
from functools import partial
from pathlib import Path

from sandbox_workspace.api.backends.bwrap import bwrap_argv, bwrap_path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "support"))
from wheel_index import make_wheel

from sandbox_workspace.egress.policy import DEFAULT_FORBIDDEN, EgressPolicy, Rule
from sandbox_workspace.egress.proxy import EgressProxy, ProxyConfig


def serve_dir(directory: Path) -> int:
    handler = partial(http.server.SimpleHTTPRequestHandler, directory=str(directory))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server.server_address[1]


def start_proxy(socket_path: Path, allowed_port: int) -> None:
    loopback = ipaddress.ip_network("127.0.0.0/8")
    policies = {
        "s1": EgressPolicy((Rule.make("index.test", ports=[allowed_port], schemes=["http"]),))
    }

    async def resolve(host: str, port: int):  # the spike's own "DNS": both names are ours
        return [ipaddress.ip_address("127.0.0.1")]

    loop = asyncio.new_event_loop()
    proxy = EgressProxy(
        policies.get,
        resolve=resolve,
        config=ProxyConfig(forbidden=tuple(n for n in DEFAULT_FORBIDDEN if n != loopback)),
    )
    loop.run_until_complete(proxy.serve_unix(str(socket_path), "s1"))
    threading.Thread(target=loop.run_forever, daemon=True).start()


INSIDE = r"""
set -u
python -m sandbox_workspace.egress.relay --listen 127.0.0.1:3128 --to /tmp/.egress/egress.sock \
    --ready-file /tmp/relay.port &
for i in $(seq 100); do [ -s /tmp/relay.port ] && break; sleep 0.05; done
echo "--- interfaces in the namespace:"; tail -n +3 /proc/net/dev | cut -d: -f1
echo "--- direct to the host's index port (must fail):"
python -c "import socket; socket.create_connection(('127.0.0.1', $ALLOWED_PORT), timeout=3)" \
    2>&1 | tail -1
export HTTP_PROXY=http://127.0.0.1:3128 HTTPS_PROXY=http://127.0.0.1:3128
t0=$(date +%s.%N)
echo "--- pip install from the allowed index:"
python -m pip install --no-cache-dir --disable-pip-version-check --target /tmp/t1 \
    --trusted-host index.test --index-url http://index.test:$ALLOWED_PORT/simple/ egress-probe \
    > /tmp/pip1.log 2>&1; rc=$?; tail -1 /tmp/pip1.log
echo "rc=$rc in $(echo "$(date +%s.%N) - $t0" | bc) s"
echo "--- pip install from another index:"
python -m pip install --no-cache-dir --disable-pip-version-check --target /tmp/t2 -vv --retries 0 \
    --timeout 5 --trusted-host other.test --index-url http://other.test:$OTHER_PORT/simple/ \
    egress-probe > /tmp/pip2.log 2>&1; rc=$?
grep "Could not fetch URL" /tmp/pip2.log | cut -c1-200; tail -1 /tmp/pip2.log
echo "rc=$rc"
PYTHONPATH=/tmp/t1 python -c "import egress_probe; print('installed from', egress_probe.ORIGIN)"
"""


def main() -> None:
    bwrap = bwrap_path()
    if bwrap is None:
        sys.exit("bubblewrap is not installed")
    root = Path(tempfile.mkdtemp(prefix="egress-ns-"))
    allowed, other = root / "allowed-index", root / "other-index"
    make_wheel(allowed, "egress-probe", "1.0")
    make_wheel(other, "egress-probe", "6.6.6")
    allowed_port, other_port = serve_dir(allowed), serve_dir(other)
    data_dir = root / "data"
    session_dir = data_dir / "sessions" / "s1"
    workspace = session_dir / "workspace"
    workspace.mkdir(parents=True)
    socket_dir = root / "egress-s1"
    socket_dir.mkdir()
    start_proxy(socket_dir / "egress.sock", allowed_port)
    argv = bwrap_argv(bwrap, data_dir=data_dir, run_dir=session_dir, workspace=workspace)
    assert argv[-1] == "--"
    # The two additions: a namespace of its own, and the proxy's socket for this session.
    argv = [*argv[:-1], "--unshare-net", "--ro-bind", str(socket_dir), "/tmp/.egress", "--"]
    env = {
        "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
        "ALLOWED_PORT": str(allowed_port),
        "OTHER_PORT": str(other_port),
        "HOME": "/tmp",
    }
    t0 = time.perf_counter()
    out = subprocess.run(
        [*argv, "bash", "-c", INSIDE], env=env, capture_output=True, text=True, timeout=120
    )
    print(out.stdout, out.stderr, f"(whole run {time.perf_counter() - t0:.2f} s)", sep="\n")


if __name__ == "__main__":
    main()
