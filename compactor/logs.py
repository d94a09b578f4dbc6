"""JSON-lines logging for the worker process: one object a line on stderr.

``{"ts": "...Z", "level": "info", "logger": "...", "event": "compacted", <extra fields>}``.
Fields passed with ``extra={...}`` become top-level keys; anything orjson cannot encode is
written as its ``repr``. Only entry points call :func:`configure`.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import orjson

from store.clock import iso_ms

# Attributes every LogRecord has; anything else on a record came from ``extra``.
_STANDARD = set(vars(logging.LogRecord("x", 0, "x", 0, "x", None, None))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": iso_ms(int(record.created * 1000)),
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                out[key] = value
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(out, default=repr).decode()


def configure(level: str = "INFO") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # botocore's debug chatter is not ours to print.
    for noisy in ("botocore", "boto3", "urllib3", "s3transfer"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
