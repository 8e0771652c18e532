"""The warm pool (issue 25): ready sandbox pods claimed by starting sessions.

- ``spec``: pure rules and builders (eligibility, pool pod, the claim's compare-and-swap).
- ``state``: what this operator knows of its pools, and their metrics.
- ``claim``: a session takes a pod (the hook in ``handlers/sessions.py``).
- ``refill``: keeps the pools full; follows pool pods' events (kopf handlers); writes
  the counts into each pool namespace's SandboxPool.
- ``resource``: the SandboxPool custom resource (what ``kubectl get sandboxpools`` shows).

Only ``spec`` and ``state`` are re-exported here: ``claim`` and ``refill`` use the
operator's context, which itself holds a ``PoolState`` (one-way imports, STYLE 18).
"""

from .spec import CLAIMED, FREE, LABEL_POOL, misfits
from .state import PoolMetrics, PoolState

__all__ = ["CLAIMED", "FREE", "LABEL_POOL", "PoolMetrics", "PoolState", "misfits"]
