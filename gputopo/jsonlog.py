"""Structured logs: one JSON object per line, an `event` name plus key=value context.

Both daemons log every decision with its reason through this, so an operator can grep or
ship the lines as they are. Configured once by each entry point; the core never logs.
"""

from __future__ import annotations

import json
import logging
import math
import sys
import time
from typing import Any


class JsonFormatter(logging.Formatter):
    """Render a record as one JSON line; `extra={"fields": {...}}` adds context keys."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            for key, value in fields.items():
                doc[f"{key}_" if key in doc else key] = value  # never overwrite ts/level/event
        if record.exc_info and record.exc_info[0] is not None:
            doc["error"] = f"{record.exc_info[0].__name__}: {record.exc_info[1]}"
        try:
            return json.dumps(doc, default=str, separators=(",", ":"), allow_nan=False)
        except ValueError:  # NaN/Infinity are not JSON; jq and log shippers drop such lines
            return json.dumps(_finite(doc), default=str, separators=(",", ":"))


def _finite(value: Any) -> Any:
    """`value` with every non-finite float spelled as a string ("nan", "inf", "-inf")."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def setup(level: str = "info", stream: Any = None) -> None:
    """Send all logging to `stream` (stderr) as JSON lines at `level`."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


def event(logger: logging.Logger, name: str, level: int = logging.INFO, /, **fields: Any) -> None:
    """Log one event with its fields: `event(log, "allocate", size=2, chosen=[0, 3], reason=...)`."""
    logger.log(level, name, extra={"fields": fields})
