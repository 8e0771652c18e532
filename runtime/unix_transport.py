"""An httpx transport that sends a request over a Unix socket when the request names one.

Contract: a request whose ``extensions["unix_socket"]`` is a path goes over that socket
(one pooled ``httpx.AsyncHTTPTransport(uds=…)`` per path, at most ``max_sockets`` kept:
the least recently used is closed past that); any other request goes to ``default``.
The runtime client sets the extension for a runtime that listens on a socket (the local
backend's runtimes in network namespaces of their own); where a client lacks this
transport, such a request goes to its URL's host, ``runtime.invalid``, which never
resolves (RFC 6761): it fails as an unreachable runtime, never reaches something else.
"""

from __future__ import annotations

from collections import OrderedDict

import httpx

UNIX_SOCKET = "unix_socket"
UNRESOLVABLE_BASE = "http://runtime.invalid"


class UnixSocketRouting(httpx.AsyncBaseTransport):
    def __init__(self, default: httpx.AsyncBaseTransport, *, max_sockets: int = 1024) -> None:
        self.default = default
        self.max_sockets = max_sockets
        self._by_path: OrderedDict[str, httpx.AsyncHTTPTransport] = OrderedDict()

    def _for(self, path: str) -> httpx.AsyncHTTPTransport:
        transport = self._by_path.pop(path, None) or httpx.AsyncHTTPTransport(uds=path)
        self._by_path[path] = transport
        return transport

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        path = request.extensions.get(UNIX_SOCKET)
        if not path:
            return await self.default.handle_async_request(request)
        transport = self._for(path)
        while len(self._by_path) > self.max_sockets:
            _, oldest = self._by_path.popitem(last=False)
            await oldest.aclose()
        return await transport.handle_async_request(request)

    async def aclose(self) -> None:
        while self._by_path:
            await self._by_path.popitem()[1].aclose()
        await self.default.aclose()
