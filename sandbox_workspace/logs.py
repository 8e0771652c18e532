"""Structured logging: one JSON object per line (``json``) or readable text (``text``).

Fields passed with ``extra={...}`` become top-level keys of the JSON line, so
``log.info("runtime ready", extra={"session_id": sid})`` is searchable by session id.
"""

from __future__ import annotations

import json
import logging
import os
from datetime import UTC, datetime

# Not fields of a line: the record's own attributes, and the settings object kopf's object
# loggers attach to every record (its repr, ~1.7 KB, was in every kopf line).
_STANDARD = set(logging.makeLogRecord({}).__dict__) | {"message", "asctime", "settings"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        line.update({k: v for k, v in record.__dict__.items() if k not in _STANDARD})
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


def configure(level: str = "info", fmt: str | None = None) -> None:
    fmt = fmt or os.environ.get("SANDBOX_WORKSPACE_LOG_FORMAT", "json")
    handler = logging.StreamHandler()
    handler.setFormatter(
        JsonFormatter()
        if fmt == "json"
        else logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # httpx logs every request at INFO; our own logs already say what matters.
    logging.getLogger("httpx").setLevel(logging.WARNING)
