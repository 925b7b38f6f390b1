"""The output topics' JSON Schemas as Schema Registry subjects (`<topic>-value`),
registered when a processor starts with STREAM_SCHEMA_REGISTRY_OUTPUTS and by `stream
schemas --register`: a schema that is not backward compatible with its subject's latest
version is refused (the processor does not start) unless forced.

Synchronous, through confluent-kafka's registry client: it runs once, before the processor
takes work.
"""

from __future__ import annotations

import logging
from typing import Any

from instanced_stream.core.spec import AgentSpec
from instanced_stream.core.subjects import output_schemas, subject_of
from instanced_stream.core.wire import prefix
from instanced_stream.kafka.registry import RegistryError, client_conf, transport_error
from instanced_stream.settings import Settings

__all__ = ["Incompatible", "output_frames"]

log = logging.getLogger("stream.registry")

_NOT_FOUND = 404


class Incompatible(RegistryError):
    """A new output schema is not backward compatible with its subject's latest version."""

    def __init__(self, subjects: list[str]) -> None:
        super().__init__(
            f"output schemas not backward compatible with the registered ones: "
            f"{', '.join(subjects)} (a consumer of these topics may break; set "
            "STREAM_SCHEMA_REGISTRY_FORCE=true or pass --force to register them anyway)",
            subjects=subjects,
        )
        self.subjects = subjects


def _registered(client: Any, subject: str, schema: Any) -> int | None:
    """The id of `schema` under `subject` when it is registered there already."""
    from confluent_kafka.schema_registry import SchemaRegistryError

    try:
        return int(client.lookup_schema(subject, schema).schema_id)
    except SchemaRegistryError as exc:
        if exc.http_status_code == 404:  # no such subject, or not this schema
            return None
        raise


def _client(settings: Settings) -> Any:
    try:
        from confluent_kafka.schema_registry import SchemaRegistryClient
    except ImportError as exc:
        raise RegistryError(
            "STREAM_SCHEMA_REGISTRY_URL needs the registry extra: "
            "pip install 'instanced-stream[registry]'"
        ) from exc
    return SchemaRegistryClient(client_conf(settings))


def output_frames(
    settings: Settings, spec: AgentSpec, *, force: bool | None = None
) -> dict[str, bytes]:
    """Register every output topic's schema (BACKWARD compatibility asked of each subject)
    and return each topic's frame prefix; {} when STREAM_SCHEMA_REGISTRY_OUTPUTS is off.
    Nothing is registered when one schema is refused."""
    if not settings.schema_registry_outputs:
        return {}
    from confluent_kafka.schema_registry import Schema, SchemaRegistryError

    forced = settings.schema_registry_force if force is None else force
    client = _client(settings)
    wanted = {t: Schema(text, "JSON") for t, text in output_schemas(spec, settings.topics).items()}
    try:
        broken = [subject_of(t) for t, s in wanted.items() if not _compatible(client, t, s)]
        if broken and not forced:
            raise Incompatible(broken)
        frames: dict[str, bytes] = {}
        for topic, schema in wanted.items():
            subject = subject_of(topic)
            if subject in broken:
                log.warning("registering %s although it is not backward compatible", subject)
                client.set_compatibility(subject, "NONE")  # else the rule refuses it
            found = None if subject in broken else _registered(client, subject, schema)
            sid = found if found is not None else int(client.register_schema(subject, schema))
            how = "found" if found is not None else "registered"
            log.info("schema registry: subject %s %s, schema id %d", subject, how, sid)
            frames[topic] = prefix(sid)
            client.set_compatibility(subject, "BACKWARD")
        return frames
    except SchemaRegistryError as exc:
        raise RegistryError(f"the schema registry refused: {exc}") from exc
    except Exception as exc:
        if not transport_error(exc):
            raise
        raise RegistryError(
            f"cannot reach the schema registry at {settings.schema_registry_url}: {exc}",
            retriable=True,
        ) from exc
    finally:
        client.close()


def _compatible(client: Any, topic: str, schema: Any) -> bool:
    from confluent_kafka.schema_registry import SchemaRegistryError

    try:
        return bool(client.test_compatibility(subject_of(topic), schema))
    except SchemaRegistryError as exc:
        if exc.http_status_code == _NOT_FOUND:
            return True  # a new subject: nothing to break
        raise
