"""Structured logs: one JSON object per line, for log pipelines (STREAM_LOG_FORMAT=json).

python-json-logger's formatter (orjson underneath) in our field names: `ts` (UTC, ISO
8601), `level`, `logger`, `message`, `error` (a traceback) and every field the code that
logs passes with `extra=` (`batch_id`, `instance`, source position...), so one item can be
followed through the processor's log.
"""

from __future__ import annotations

import logging
from typing import Any

from pythonjsonlogger.orjson import OrjsonFormatter

__all__ = ["JsonFormatter", "json_handler", "quiet_library_chatter"]

# aiokafka's INFO lines that repeat per producer and consumer at every start (one per
# transactional id: dozens on a processor), saying nothing an operator acts on.
_CHATTER = {
    "aiokafka.producer.sender": ("Discovered coordinator",),
    "aiokafka.consumer.group_coordinator": ("Discovered coordinator",),
    # The HTTP client under openai and the registry client: a line per request (each
    # model request; 30 registry lookups at a start with STREAM_SCHEMA_REGISTRY_OUTPUTS)
    # repeats what the product's own lines and metrics say.
    "httpx2": ("HTTP Request:",),
}


def _trace_ids() -> dict[str, str]:
    """The current span's ids (OpenTelemetry), so a log line joins its trace. The thin
    worker package does not ship OpenTelemetry: there, no ids."""
    try:
        from instanced_stream.observe.telemetry import current_ids
    except ImportError:
        return {}
    return current_ids()


class JsonFormatter(OrjsonFormatter):
    def __init__(self) -> None:
        super().__init__(
            "{levelname}{name}{message}",
            style="{",
            rename_fields={"levelname": "level", "name": "logger", "exc_info": "error"},
            timestamp="ts",
            json_default=str,
        )

    def add_fields(
        self, log_data: dict[str, Any], record: logging.LogRecord, message_dict: dict[str, Any]
    ) -> None:
        super().add_fields(log_data, record, message_dict)
        log_data.update(_trace_ids())


def json_handler() -> logging.Handler:
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter())
    return handler


class _Demoted(logging.Filter):
    """Rewrites a chatter line to DEBUG; shown only where DEBUG is."""

    def __init__(self, starts: tuple[str, ...]) -> None:
        super().__init__()
        self.starts = starts

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno != logging.INFO or not str(record.msg).startswith(self.starts):
            return True
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return logging.getLogger().isEnabledFor(logging.DEBUG)


def quiet_library_chatter() -> None:
    """Library start-up lines at DEBUG: installed once per process, by the CLI."""
    for name, starts in _CHATTER.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, _Demoted) for f in logger.filters):
            logger.addFilter(_Demoted(starts))
