"""The Schema Registry wire format at the edges, without a registry: telling framed
records from plain JSON, what happens to a framed record when no registry is set, the
subjects' schemas a spec gives, and framed output records."""

from __future__ import annotations

import copy

import orjson
import pytest
from instanced_stream.core.live_spec import LiveSpec
from instanced_stream.core.messages import SourcePosition
from instanced_stream.core.spec import AgentSpec, load_spec
from instanced_stream.core.subjects import activity_schema, output_schemas, subject_of
from instanced_stream.core.wire import frame, json_bytes, prefix, schema_id
from instanced_stream.errors import BadRecord
from instanced_stream.kafka.registry import client_conf, registry_for, transport_error
from instanced_stream.runtime.pipeline.intake import as_json
from instanced_stream.runtime.pipeline.outcomes.letters import bad_record
from instanced_stream.runtime.pipeline.outcomes.records import RecordBuilder
from instanced_stream.settings import DEFAULT_SPEC, Settings

SRC = SourcePosition(topic="items", partition=0, offset=3, key="k")


def test_a_framed_record_is_told_from_plain_json() -> None:
    framed = frame(258, b"\x02hi")
    assert framed[:5] == b"\x00\x00\x00\x01\x02"
    assert schema_id(framed) == 258
    assert schema_id(b'{"_instance": "a"}') is None
    assert schema_id(b"   {}") is None
    assert schema_id(b"\x00\x00") is None  # too short to hold a frame
    assert schema_id(None) is None
    with pytest.raises(ValueError, match="32-bit"):
        prefix(2**32)


def test_json_readers_see_the_payload_of_a_framed_output() -> None:
    assert json_bytes(frame(7, b'{"a": 1}')) == b'{"a": 1}'
    assert json_bytes(b'{"a": 1}') == b'{"a": 1}'
    assert json_bytes(None) == b"{}"


async def test_without_a_registry_a_framed_record_is_a_dead_letter_with_its_id() -> None:
    with pytest.raises(BadRecord) as caught:
        await as_json(None, frame(42, b"\x02hi"), "items")
    assert caught.value.code == "unknown_schema"
    assert "schema id 42" in caught.value.message
    assert "STREAM_SCHEMA_REGISTRY_URL" in caught.value.message
    plain = b'{"_instance": "a", "comment": "hi"}'
    assert await as_json(None, plain, "items") is plain
    assert await as_json(None, None, "items") is None  # parse_item says what a tombstone is


def test_the_activity_subject_carries_the_tools_parameters() -> None:
    spec = load_spec(DEFAULT_SPEC)
    tool = next(t for t in spec.tools if t.name == "moderateComment")
    call = activity_schema(tool)["properties"]["call"]
    assert call["properties"]["decision"]["enum"] == ["approve", "reject"]
    assert {"_tool", "_instance", "decision", "reason"} <= set(call["required"])
    assert call["additionalProperties"] is False  # as the tool's parameters say
    topics = Settings(topic_prefix="p.").topics
    schemas = output_schemas(spec, topics)
    assert set(schemas) >= {
        "p.activity.moderateComment",
        "p.activity.notifyAuthor",
        topics.dead_letter,
        topics.no_action,
        topics.review,
    }
    assert output_schemas(spec, topics) == schemas  # same spec, same text: same version
    assert subject_of("p.stream.deadletter") == "p.stream.deadletter-value"


def test_a_changed_parameter_changes_only_its_tools_subject() -> None:
    spec = load_spec(DEFAULT_SPEC)
    doc = spec.model_dump(by_alias=True, exclude_none=True)
    changed = copy.deepcopy(doc)
    changed["tools"][0]["parameters"]["properties"]["reason"]["type"] = "integer"
    topics = Settings().topics
    before = output_schemas(spec, topics)
    after = output_schemas(AgentSpec.model_validate(changed), topics)
    differ = {t for t in before if before[t] != after[t]}
    assert differ == {topics.activity("moderateComment")}


def test_output_records_carry_their_topics_frame() -> None:
    spec = load_spec(DEFAULT_SPEC)
    topics = Settings().topics
    letter = bad_record(BadRecord("not_json", "no"), SRC, b"{x")
    builder = RecordBuilder(LiveSpec(spec), topics, "m")
    builder.frames = {topics.dead_letter: prefix(9)}
    value = builder.letter(letter).records[0].value
    assert schema_id(value) == 9
    assert orjson.loads(json_bytes(value))["code"] == "not_json"
    plain = RecordBuilder(LiveSpec(spec), topics, "m").letter(letter).records[0].value
    assert plain == json_bytes(value)


def test_registry_credentials_come_from_the_settings_and_stay_secret() -> None:
    settings = Settings(
        schema_registry_url="https://registry.example:8081",
        schema_registry_username="stream",
        schema_registry_password="s3cret",
    )
    assert client_conf(settings)["basic.auth.user.info"] == "stream:s3cret"
    assert "s3cret" not in repr(settings)
    assert registry_for(Settings()) is None


def test_a_registry_that_is_away_is_waited_for_and_one_that_refuses_is_not() -> None:
    from confluent_kafka.schema_registry import SchemaRegistryError

    assert transport_error(SchemaRegistryError(503, 50301, "unavailable"))
    assert transport_error(SchemaRegistryError(429, 42901, "slow down"))
    assert not transport_error(SchemaRegistryError(401, 40101, "unauthorized"))
    assert not transport_error(SchemaRegistryError(404, 40403, "no such schema"))
    assert not transport_error(ValueError("a bug"))


async def test_the_activity_sdk_reads_a_framed_activity_record() -> None:
    from instanced_stream.activities.worker import Activities
    from instanced_stream.core.messages import ActivityRecord, BatchRef, Call

    from tests.fakes import FakePublisher

    seen: list[str] = []
    acts = Activities()

    @acts.activity("moderateComment")
    async def moderate(call: Call, tool: object, context: object) -> None:
        seen.append(str(call.arguments["decision"]))

    call = Call.model_validate(
        {"_tool": "moderateComment", "_instance": "c-1", "decision": "reject", "reason": "x"}
    )
    record = ActivityRecord(
        call_id="items/0/3/moderateComment/0",
        tool="moderateComment",
        instance="c-1",
        call=call,
        source=SRC,
        batch=BatchRef(id="b", size=1, token="①", attempt=1),
        model="m",
    )
    value = frame(11, record.model_dump_json(by_alias=True).encode())
    tool = load_spec(DEFAULT_SPEC).tool("moderateComment")
    assert tool is not None
    await acts.serve_one(value, tool, Settings(bootstrap_servers="unused:9092"), FakePublisher())
    assert seen == ["reject"]
