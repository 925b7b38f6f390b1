"""The Confluent Schema Registry wire format: byte 0 (magic), the schema id as 4 bytes
big-endian, then the payload (Avro binary, JSON text, Protobuf). A JSON text never starts
with a zero byte, so one look tells a framed record from plain JSON on the same topic."""

from __future__ import annotations

__all__ = ["HEADER", "MAGIC", "frame", "json_bytes", "prefix", "schema_id"]

MAGIC = 0
HEADER = 5  # magic byte + schema id


def schema_id(value: bytes | None) -> int | None:
    """The schema id of a framed record; None for anything else (plain JSON, a tombstone,
    a record too short to hold a frame)."""
    if value is None or len(value) < HEADER or value[0] != MAGIC:
        return None
    return int.from_bytes(value[1:HEADER], "big")


def prefix(schema: int) -> bytes:
    """The 5 bytes that frame every record written under one schema id."""
    if not 0 <= schema < 2**32:
        raise ValueError(f"a schema id is an unsigned 32-bit number, not {schema}")
    return bytes([MAGIC]) + schema.to_bytes(4, "big")


def frame(schema: int, payload: bytes) -> bytes:
    return prefix(schema) + payload


def json_bytes(value: bytes | None) -> bytes:
    """What a JSON reader of an output topic parses: the payload of a record framed as
    JSON Schema (STREAM_SCHEMA_REGISTRY_OUTPUTS), else the value itself."""
    if value is None:
        return b"{}"
    return value[HEADER:] if schema_id(value) is not None else value
