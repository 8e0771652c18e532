"""The egress proxy (issue 40): the only way a sandbox's traffic leaves it.

- ``policy``: the per-session egress policy and the pure decisions over it (which
  scheme/host/port is allowed, which resolved addresses are never reachable).
- ``tls``: reading the server name out of a TLS ClientHello without terminating TLS.
- ``proxy``: the asyncio HTTP proxy (CONNECT tunnels and plain ``http://`` requests) that
  applies a session's policy, resolves names itself and refuses what the policy does not
  allow with a reason the sandboxed code sees.
"""
