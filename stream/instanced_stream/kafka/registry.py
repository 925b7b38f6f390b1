"""The Schema Registry, through confluent-kafka's client and serdes (`confluent_kafka.
schema_registry`, the `registry` extra): the client from the settings, and input records
in the wire format decoded by their schema id (kafka/schemas.py registers the outputs').

The processor stays on aiokafka: the serdes are used as functions on record bytes. A
registry that does not answer holds the stream back (retried with back-off, as a broker
outage is); a record it cannot account for is a dead letter with the reason.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from datetime import date, datetime, time
from decimal import Decimal
from typing import TYPE_CHECKING, Any

import orjson

from instanced_stream.core.wire import schema_id
from instanced_stream.errors import BadRecord, StreamError
from instanced_stream.retry import RetryPolicy
from instanced_stream.settings import Settings

if TYPE_CHECKING:
    from confluent_kafka.schema_registry import AsyncSchemaRegistryClient

__all__ = [
    "Registry",
    "RegistryError",
    "client_conf",
    "registry_for",
    "registry_of",
    "transport_error",
]

log = logging.getLogger("stream.registry")

_BACKOFF = RetryPolicy(base_s=0.5, cap_s=15.0)
_NOT_FOUND = 404


class RegistryError(StreamError):
    """The registry refused a request, or could not be reached (`retriable`)."""

    def __init__(self, message: str, *, retriable: bool = False, **data: Any) -> None:
        super().__init__(message, **data)
        self.retriable = retriable


def client_conf(settings: Settings) -> dict[str, Any]:
    """confluent-kafka's registry client configuration from the settings."""
    if not settings.schema_registry_url:
        raise RegistryError("STREAM_SCHEMA_REGISTRY_URL is not set")
    conf: dict[str, Any] = {"url": settings.schema_registry_url}
    if settings.schema_registry_username:
        password = settings.schema_registry_password
        secret = password.get_secret_value() if password else ""
        conf["basic.auth.user.info"] = f"{settings.schema_registry_username}:{secret}"
    if settings.schema_registry_cafile:
        conf["ssl.ca.location"] = str(settings.schema_registry_cafile)
    return conf


def _jsonable(value: Any) -> Any:
    # Avro's logical types and bytes as fastavro returns them; JSON has no such values.
    if isinstance(value, bytes):
        return value.decode("utf-8", "backslashreplace")
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, datetime | date | time):
        return value.isoformat()
    raise TypeError(f"{type(value).__name__} has no JSON form")


def transport_error(exc: BaseException) -> bool:
    """The registry is away or overloaded, not refusing: httpx's (or httpx2's) connection
    and timeout errors (without importing either), and its 5xx and 429 answers."""
    status = getattr(exc, "http_status_code", None)
    if isinstance(status, int) and (status >= 500 or status == 429):
        return True
    return any(c.__name__ in ("TransportError", "TimeoutException") for c in type(exc).__mro__)


class Registry:
    """One registry client and the deserializers by schema type, built once."""

    def __init__(self, settings: Settings) -> None:
        try:
            from confluent_kafka.schema_registry import AsyncSchemaRegistryClient
        except ImportError as exc:
            raise RegistryError(
                "STREAM_SCHEMA_REGISTRY_URL needs the registry extra: "
                "pip install 'instanced-stream[registry]'"
            ) from exc
        self.url = settings.schema_registry_url
        self.client: AsyncSchemaRegistryClient = AsyncSchemaRegistryClient(client_conf(settings))
        self._decoders: dict[str, Callable[..., Any]] = {}

    async def _retrying(self, what: str, call: Callable[[], Any]) -> Any:
        """Await `call()` until the registry answers: an outage holds the stream back."""
        attempt = 0
        while True:
            try:
                return await call()
            except Exception as exc:
                if not transport_error(exc):
                    raise
                attempt += 1
                delay = _BACKOFF.delay(attempt)
                log.warning(
                    "schema registry %s unreachable (%s: %s); %s again in %.1fs",
                    self.url,
                    type(exc).__name__,
                    exc,
                    what,
                    delay,
                )
                await asyncio.sleep(delay)

    async def _decoder(self, kind: str) -> Callable[..., Any]:
        found = self._decoders.get(kind)
        if found is not None:
            return found
        conf = {"subject.name.strategy.type": "TOPIC"}
        made: Callable[..., Any]
        if kind == "AVRO":
            from confluent_kafka.schema_registry.avro import AsyncAvroDeserializer

            made = await AsyncAvroDeserializer(self.client, conf=conf)
        elif kind == "JSON":
            from confluent_kafka.schema_registry.json_schema import AsyncJSONDeserializer

            made = await AsyncJSONDeserializer(None, schema_registry_client=self.client, conf=conf)
        else:
            raise BadRecord(
                "unknown_schema",
                f"schema type {kind} is not decoded here (Avro and JSON Schema are); "
                "publish this topic's items as Avro, JSON Schema or plain JSON",
            )
        self._decoders[kind] = made
        return made

    async def to_json(self, value: bytes, topic: str) -> bytes:
        """A framed record's value as JSON text, or BadRecord saying why it cannot be."""
        from confluent_kafka.schema_registry import SchemaRegistryError
        from confluent_kafka.serialization import MessageField, SerializationContext

        sid = schema_id(value)
        assert sid is not None, "to_json is for framed records"
        try:
            schema = await self._retrying("lookup", lambda: self.client.get_schema(sid))
        except SchemaRegistryError as exc:
            if exc.http_status_code == _NOT_FOUND:
                raise BadRecord(
                    "unknown_schema",
                    f"schema id {sid} is not in the schema registry at {self.url}",
                ) from exc
            raise RegistryError(f"schema registry refused the lookup of id {sid}: {exc}") from exc
        kind = schema.schema_type or "AVRO"
        decode = await self._decoder(kind)
        ctx = SerializationContext(topic, MessageField.VALUE)
        try:
            obj = await self._retrying("decode", lambda: decode(value, ctx))
        except BadRecord:
            raise
        except Exception as exc:  # fastavro, jsonschema and the serdes' own errors
            raise BadRecord(
                "undecodable",
                f"record does not decode with its schema (id {sid}, {kind}): "
                f"{type(exc).__name__}: {exc}",
            ) from exc
        try:
            return orjson.dumps(obj, default=_jsonable)
        except TypeError as exc:
            raise BadRecord("undecodable", f"schema id {sid} ({kind}): {exc}") from exc


def registry_for(settings: Settings) -> Registry | None:
    """The registry the settings name, or None when there is none."""
    return Registry(settings) if settings.schema_registry_url else None


@functools.cache
def registry_of(settings: Settings) -> Registry | None:
    """registry_for, once per settings object: the processor's one client and its caches
    of schemas by id (the settings are frozen, so equal settings share them)."""
    return registry_for(settings)
