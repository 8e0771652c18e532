"""Sizes written as bytes or as Kubernetes quantities (``512Mi``, ``1G``, ``1.5Gi``, ``2e9``).

Contract: ``parse_bytes(value)`` → a non-negative ``int`` of bytes for an ``int`` or a
string in Kubernetes' quantity syntax (binary suffixes ``Ki Mi Gi Ti Pi Ei``, decimal
``k M G T P E``, exponents ``e6``); a fraction of a byte is rounded up, as Kubernetes
does for byte quantities. Anything else — negative, a milli (``m``) suffix that leaves a
fraction, unknown suffixes, booleans — raises ``ValueError`` naming the value and the
accepted forms. The one parser of sizes for the runtime, the API and the operator.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal, InvalidOperation

_SUFFIXES = {
    "": 1,
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
    "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18,
}  # fmt: skip
_QUANTITY = re.compile(
    r"^\+?(?P<number>[0-9]+(\.[0-9]*)?|\.[0-9]+)"
    r"(?:(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)|[eE](?P<exponent>[+-]?[0-9]+))?$"
)
_FORMS = "bytes (1048576) or a Kubernetes quantity (512Mi, 1Gi, 500M, 1e9)"


def parse_bytes(value: object) -> int:
    """Bytes of ``value`` (see the module contract)."""
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError(f"{value!r} is not a size: give {_FORMS}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"{value} is negative: a size is 0 or more bytes")
        return value
    match = _QUANTITY.match(value.strip())
    if match is None:
        raise ValueError(f"{value!r} is not a size: give {_FORMS}")
    try:
        number = Decimal(match["number"])
    except InvalidOperation as e:  # the pattern admits only decimals; kept for safety
        raise ValueError(f"{value!r} is not a size: give {_FORMS}") from e
    if match["exponent"] is not None:
        exponent = int(match["exponent"])
        if abs(exponent) > 30:
            raise ValueError(f"{value!r} is out of range")
        number = number.scaleb(exponent)
    else:
        number *= _SUFFIXES[match["suffix"] or ""]
    return math.ceil(number)
