"""Tool-call arguments checked against the tool's declared JSON schema, before any call.

Contract: ``check_arguments(name, raw, parameters)`` returns the arguments to call the tool
with, or raises ``InvalidArguments`` whose message names the field, what is expected and
what was sent — the model reads it as the tool's answer and can retry. Keys the schema
does not declare (models add ``language`` to ``execute_code``) are dropped and logged, not
refused. Checked: JSON object, required keys, ``type`` (string, integer, number, boolean;
``true`` is never a number; ``5.0`` is an integer), ``minLength``, ``minimum``,
``maximum``, ``exclusiveMinimum``. Nothing a model sends can raise anything else.
"""

from __future__ import annotations

import json
import logging
from typing import Any

log = logging.getLogger(__name__)

_TYPE_NAMES = {"string": "a string", "integer": "an integer", "number": "a number"}
_TYPE_NAMES["boolean"] = "true or false"


class InvalidArguments(ValueError):
    """The model's arguments do not fit the tool's schema; the message says how."""


def _describe(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 60 else text[:57] + "..."


def _check_value(field: str, value: Any, rules: dict) -> Any:
    kind = rules.get("type")
    expected = _TYPE_NAMES.get(kind, kind)
    if kind == "string" and not isinstance(value, str):
        raise InvalidArguments(f"'{field}' must be {expected}, not {_describe(value)}")
    if kind in ("integer", "number"):
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise InvalidArguments(f"'{field}' must be {expected}, not {_describe(value)}")
        if kind == "integer":
            if isinstance(value, float) and not value.is_integer():
                raise InvalidArguments(f"'{field}' must be {expected}, not {_describe(value)}")
            value = int(value)
        if value != value or value in (float("inf"), float("-inf")):
            raise InvalidArguments(f"'{field}' must be a finite number")
        if "exclusiveMinimum" in rules and not value > rules["exclusiveMinimum"]:
            bound = rules["exclusiveMinimum"]
            raise InvalidArguments(f"'{field}' must be greater than {bound}, not {value}")
        if "minimum" in rules and value < rules["minimum"]:
            raise InvalidArguments(f"'{field}' must be at least {rules['minimum']}, not {value}")
        if "maximum" in rules and value > rules["maximum"]:
            raise InvalidArguments(f"'{field}' must be at most {rules['maximum']}, not {value}")
    if kind == "boolean" and not isinstance(value, bool):
        raise InvalidArguments(f"'{field}' must be {expected}, not {_describe(value)}")
    if isinstance(value, str) and len(value) < rules.get("minLength", 0):
        raise InvalidArguments(f"'{field}' must not be empty")
    return value


def check_arguments(name: str, raw: str | None, parameters: dict) -> dict[str, Any]:
    try:
        args = json.loads(raw or "{}")
    except ValueError as e:
        raise InvalidArguments(
            f"the arguments are not valid JSON ({e}); send one JSON object"
        ) from e
    if not isinstance(args, dict):
        raise InvalidArguments(f"the arguments must be a JSON object, not {_describe(args)}")
    properties: dict = parameters.get("properties", {})
    unknown = sorted(set(args) - set(properties))
    if unknown:
        log.info("tool %s: ignored undeclared arguments %s", name, ", ".join(unknown))
    missing = [k for k in parameters.get("required", []) if args.get(k) is None]
    if missing:
        raise InvalidArguments(
            f"missing required argument(s): {', '.join(repr(k) for k in missing)}"
        )
    checked = {}
    for key, rules in properties.items():
        if key in args and args[key] is not None:  # null means "use the default"
            checked[key] = _check_value(key, args[key], rules)
    return checked


def usage(name: str, parameters: dict) -> str:
    """How to call the tool, for the model: ``name(code: string, timeout?: number)``."""
    required = set(parameters.get("required", []))
    fields = [
        f"{key}{'' if key in required else '?'}: {rules.get('type', 'any')}"
        for key, rules in parameters.get("properties", {}).items()
    ]
    return f"{name}({', '.join(fields)})"
