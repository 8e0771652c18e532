"""Which user executed code runs as: subprocess keyword arguments for a uid/gid switch.

Only passed when a switch is wanted, because uvloop's subprocess support rejects the
``user``/``group``/``extra_groups`` keywords outright.
"""

from __future__ import annotations


def identity(user: int | None, group: int | None) -> dict:
    if user is None:
        return {}
    return {"user": user, "group": group if group is not None else user, "extra_groups": []}
