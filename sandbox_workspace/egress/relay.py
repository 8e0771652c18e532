"""The relay inside a sandbox's network namespace: its only way out.

The local backend gives each session's code a network namespace with nothing but
loopback, and binds one Unix socket of the egress proxy into its filesystem. Programs
speak TCP to a proxy (``HTTP_PROXY=http://127.0.0.1:3128``), so this relay listens on a
loopback port *inside* the namespace and relays each connection to that socket, bytes
unchanged (``splice.py``: the kernel moves them, Python does not copy them). The proxy
knows the session by the socket, so the relay needs no credential and nothing it sends
is trusted; killing it only takes the session's own egress away.

    python -m sandbox_workspace.egress.relay --listen 127.0.0.1:3128 --to /run/egress.sock

Standard library only (and ``splice.py``, which is too): it runs in the sandbox next to
the runtime.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Callable
from pathlib import Path

from .splice import relay_streams


async def start_relay(host: str, port: int, target: str) -> asyncio.Server:
    """A listening relay server (``port`` 0 picks one); the caller closes it."""

    async def on_client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_unix_connection(target)
        except OSError:
            writer.close()
            return
        try:
            await relay_streams(reader, writer, up_reader, up_writer)
        except ConnectionError:
            pass  # a peer reset: both sides are closed below
        finally:
            for w in (writer, up_writer):
                w.close()

    return await asyncio.start_server(on_client, host, port)


async def relay(
    host: str, port: int, target: str, on_ready: Callable[[int], None] | None = None
) -> None:
    server = await start_relay(host, port, target)
    if on_ready is not None:
        on_ready(server.sockets[0].getsockname()[1])
    async with server:
        await server.serve_forever()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--listen", default="127.0.0.1:3128", help="HOST:PORT in the sandbox")
    parser.add_argument("--to", required=True, help="the egress proxy's Unix socket")
    parser.add_argument("--ready-file", type=Path, help="written with the port once listening")
    args = parser.parse_args(argv)
    host, _, port = args.listen.rpartition(":")
    ready = args.ready_file
    asyncio.run(relay(host, int(port), args.to, ready and (lambda p: ready.write_text(str(p)))))


if __name__ == "__main__":
    main()
