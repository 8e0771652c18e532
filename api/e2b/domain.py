"""The E2B domain setting's rule (``SANDBOX_WORKSPACE_E2B_DOMAIN``, ``hosts``).

Apart from ``hosts`` so that the settings can check the value at start-up without
importing the routing (which imports the settings' users).
"""

from __future__ import annotations

import re

_DNS_LABEL = r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?"
_DOMAIN = re.compile(rf"(?=.{{1,200}}$)({_DNS_LABEL}\.)+{_DNS_LABEL}")  # two labels or more


def check_domain(domain: str) -> str:
    """The domain as configured, lowercased; ValueError for one that is not a DNS name
    of two labels or more."""
    name = domain.strip().lower().rstrip(".")
    if not _DOMAIN.fullmatch(name):
        raise ValueError(f"'{domain}' is not a DNS name (e.g. sandboxes.example.com)")
    return name
