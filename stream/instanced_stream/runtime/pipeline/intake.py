"""The input edge: turns one consumed Kafka record into an Instance, or says exactly why
not. It is read here, beside admission (the stage that reads records into items), not in
windows/: nothing of it is windowing."""

from __future__ import annotations

from typing import Any

import orjson

from instanced_stream.core.context_kind import context_key, declared_kind
from instanced_stream.core.instance import Instance
from instanced_stream.core.messages import SourcePosition
from instanced_stream.core.wire import schema_id
from instanced_stream.errors import BadRecord
from instanced_stream.kafka.registry import Registry, registry_of
from instanced_stream.settings import Settings

__all__ = ["CONTEXT_ON_INPUT", "MAX_DEPTH", "as_json", "parse_item", "read_item", "source_of"]

# The dead letter of a context message sent to the input topic; its BadRecord's data say
# where it belongs (`context_key`), whether it may be forwarded there (`forwardable`) and
# the message as JSON (`json`: a record in the registry's wire format, decoded).
CONTEXT_ON_INPUT = "context_on_input"

_MAX_ID = 512
_KEY_KEEP = 256  # characters of a record key that outputs show
# orjson reads JSON nested up to 1024 levels but writes at most 254, and every request,
# call record and state write re-serialises the item one or two levels deeper: a
# deeper item would fail its whole batch at the prompt. Real data stays far below this.
MAX_DEPTH = 100


def _depth_over(value: bytes, payload: Any, limit: int) -> bool:
    # Fewer brackets than the limit cannot nest deeper: the common case costs two scans.
    if value.count(b"[") + value.count(b"{") <= limit:
        return False
    stack: list[tuple[Any, int]] = [(payload, 1)]
    while stack:
        node, level = stack.pop()
        if level > limit:
            return True
        if isinstance(node, dict):
            stack += [(v, level + 1) for v in node.values() if isinstance(v, dict | list)]
        elif isinstance(node, list):
            stack += [(v, level + 1) for v in node if isinstance(v, dict | list)]
    return False


async def as_json(registry: Registry | None, value: bytes | None, topic: str) -> bytes | None:
    """A record in the Schema Registry's wire format (Avro, JSON Schema) as the JSON text
    parse_item reads; any other value as it came (plain JSON, or what parse_item refuses)."""
    sid = schema_id(value)
    if sid is None or value is None:
        return value
    if registry is None:
        raise BadRecord(
            "unknown_schema",
            f"record is in the Schema Registry wire format (schema id {sid}) and no registry "
            "is configured (STREAM_SCHEMA_REGISTRY_URL)",
        )
    return await registry.to_json(value, topic)


async def read_item(
    settings: Settings,
    value: bytes | None,
    key: bytes | None,
    source: SourcePosition,
    *,
    state_input: bool = False,
) -> tuple[Instance, bytes]:
    """One input record as an instance (parse_item), decoded first when it is in the wire
    format; with the JSON text it was read from (what the window counts tokens of)."""
    text = await as_json(registry_of(settings), value, source.topic)
    instance = parse_item(
        text,
        key,
        source,
        settings.max_record_bytes,
        state_input=state_input,
        context_topic=settings.topics.context,
    )
    assert text is not None  # parse_item refuses a missing value
    return instance, text


def parse_item(
    value: bytes | None,
    key: bytes | None,
    source: SourcePosition,
    max_bytes: int,
    *,
    state_input: bool = False,
    context_topic: str = "the context topic",
) -> Instance:
    """Every record is one instance: id from `_instance`, else the record key.
    `state_input`: the spec accepts `type: state` records (`accept_state_input`); else
    one is refused, since it would rewrite its instance's workflow state. A record that
    declares a context kind (core/context_kind.py) is no instance: it is refused with
    `CONTEXT_ON_INPUT`, naming `context_topic`, and the caller forwards it there where the
    spec allows."""
    if value is None:
        raise BadRecord("not_json", "record has no value (tombstone)")
    if len(value) > max_bytes:
        raise BadRecord("too_large", f"record is {len(value)} bytes; the limit is {max_bytes}")
    try:
        payload: Any = orjson.loads(value)
    except orjson.JSONDecodeError as exc:
        raise BadRecord("not_json", f"record value is not JSON: {exc}") from exc
    if not isinstance(payload, dict):
        raise BadRecord("not_object", f"record is JSON {type(payload).__name__}, not an object")
    if _depth_over(value, payload, MAX_DEPTH):
        raise BadRecord(
            "too_large", f"record nests objects and arrays more than {MAX_DEPTH} levels deep"
        )
    declared = declared_kind(payload, key)
    if declared is not None:
        raise _context_on_input(declared, payload, source, context_topic)
    instance = payload.pop("_instance", None)
    if instance is None and key is not None:
        instance = key.decode("utf-8", "replace")
    if isinstance(instance, int | float) and not isinstance(instance, bool):
        instance = str(instance)
    if not isinstance(instance, str) or not instance.strip():
        # Not taken as a global input: the input topic carries producers' data, and a
        # global message reaches every instance's prompt; globals come from the spec and
        # the context topic, which operators control.
        raise BadRecord(
            "no_instance",
            "record has neither an '_instance' string nor a record key (global inputs go "
            "to the spec or the context topic, not the input topic)",
        )
    if len(instance) > _MAX_ID:
        raise BadRecord("no_instance", f"instance id is longer than {_MAX_ID} characters")
    kind = payload.get("type", "input")
    if kind == "state" and not state_input:
        raise BadRecord(
            "state_input_refused",
            "a type: state record on the input topic; state comes only from the "
            "processor's own turns and results unless the spec sets accept_state_input",
        )
    if kind not in ("input", "state"):
        payload["type"] = "input"
    return Instance(id=instance, payload=payload, source=source, size=len(value))


def _context_on_input(
    kind: str, payload: dict[str, Any], source: SourcePosition, topic: str
) -> BadRecord:
    origin = f"{source.topic}/{source.partition}/{source.offset}"
    key = context_key(kind, payload, origin)
    if kind in ("plan", "tool") and payload.get("_instance") is not None:
        # The seeds: a plan is global, never instanced, and so is a tool's definition.
        return BadRecord(
            CONTEXT_ON_INPUT,
            f"a type: {kind} record carries _instance, but a {kind} is global: send it "
            f"without _instance to the context topic {topic} (key {key!r})",
            context_key=key,
            forwardable=False,
        )
    return BadRecord(
        CONTEXT_ON_INPUT,
        f"a type: {kind} record is a context message, not an item: send it to the context "
        f"topic {topic} (key {key!r}), or set accept_context_input: true in the spec to "
        "have the processor forward it there",
        context_key=key,
        forwardable=True,
        json=orjson.dumps(payload),  # as the context topic reads it
    )


def source_of(
    topic: str, partition: int, offset: int, key: bytes | None, ts: int
) -> SourcePosition:
    """Where a consumed record came from, as every output of it shows. A huge key would
    be copied into every output record and make them too large for the broker, so it is
    cut (the id rule refuses it anyway)."""
    shown = None
    if key is not None:
        text = key[: _KEY_KEEP * 4].decode("utf-8", "replace")
        shown = text if len(key) <= _KEY_KEEP else f"{text[:_KEY_KEEP]}... ({len(key)} bytes)"
    return SourcePosition(
        topic=topic,
        partition=partition,
        offset=offset,
        key=shown,
        timestamp_ms=ts if ts and ts > 0 else None,
    )
