"""Structured logs: one JSON object per line, for log pipelines (STREAM_LOG_FORMAT=json).

Records carry `batch_id` and `instance` when the code that logs knows them (passed with
`extra=`), so one item can be followed through the processor's log.
"""

from __future__ import annotations

import logging
import time

import orjson

__all__ = ["JsonFormatter", "json_handler"]

_FIELDS = ("batch_id", "instance", "code", "topic", "partition", "offset")


def _trace_ids() -> dict[str, str]:
    """The current span's ids (OpenTelemetry), so a log line joins its trace. The thin
    worker package does not ship OpenTelemetry: there, no ids."""
    try:
        from instanced_stream.ops.telemetry import current_ids
    except ImportError:
        return {}
    return current_ids()


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        entry.update({k: getattr(record, k) for k in _FIELDS if hasattr(record, k)})
        entry.update(_trace_ids())
        if record.exc_info:
            entry["error"] = self.formatException(record.exc_info)
        return orjson.dumps(entry, default=str).decode()


def json_handler() -> logging.Handler:
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter())
    return handler
