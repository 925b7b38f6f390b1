"""Schema Registry formats in and out, against a real registry (Apicurio Registry's
Confluent-compatible API, started from Maven artifacts) and the real broker: producers
serialize with confluent-kafka's own serializers, a consumer reads the activity records
with its deserializer, and a spec change that breaks an activity schema is refused."""

from __future__ import annotations

import copy
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import pytest_asyncio
import yaml
from confluent_kafka.schema_registry import AsyncSchemaRegistryClient
from confluent_kafka.schema_registry.avro import AsyncAvroSerializer
from confluent_kafka.schema_registry.json_schema import (
    AsyncJSONDeserializer,
    AsyncJSONSerializer,
)
from confluent_kafka.serialization import MessageField, SerializationContext
from instanced_stream.core.subjects import subject_of
from instanced_stream.core.wire import frame, schema_id
from instanced_stream.kafka.topics import read_topic
from instanced_stream.settings import DEFAULT_SPEC, Settings
from instanced_stream_bench.testing.broker import free_port
from instanced_stream_bench.testing.schema_registry import registry_url

from tests.conftest import Deployment

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

Deploy = Callable[..., Awaitable[Deployment]]

AVRO_ITEM = json.dumps(
    {
        "type": "record",
        "name": "Comment",
        "namespace": "shop.reviews",
        "fields": [
            {"name": "_instance", "type": "string"},
            {"name": "comment", "type": "string"},
            {"name": "stars", "type": ["null", "int"], "default": None},
        ],
    }
)
JSON_ITEM = json.dumps(
    {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "title": "ForumPost",
        "type": "object",
        "properties": {"_instance": {"type": "string"}, "comment": {"type": "string"}},
        "required": ["_instance", "comment"],
    }
)


@pytest.fixture(scope="module")
def registry() -> Iterator[str]:
    """A real registry: STREAM_SCHEMA_REGISTRY_URL, else Apicurio started here."""
    with registry_url(Settings().schema_registry_url) as url:
        yield url


@pytest_asyncio.fixture
async def client(registry: str) -> AsyncIterator[AsyncSchemaRegistryClient]:
    yield AsyncSchemaRegistryClient({"url": registry})


def _ctx(topic: str) -> SerializationContext:
    return SerializationContext(topic, MessageField.VALUE)


async def test_avro_json_schema_and_plain_json_items_are_decided_and_audited(
    deploy: Deploy, registry: str, client: AsyncSchemaRegistryClient
) -> None:
    dep = await deploy(STREAM_SCHEMA_REGISTRY_URL=registry, STREAM_SCHEMA_REGISTRY_OUTPUTS="true")
    topic = dep.settings.topics.input
    # Producers as a Kafka shop writes them: the library's serializers register the
    # schemas (Avro under <topic>-value, JSON Schema under <topic>-<title>).
    avro = await AsyncAvroSerializer(
        client, AVRO_ITEM, conf={"subject.name.strategy.type": "TOPIC"}
    )
    as_json = await AsyncJSONSerializer(
        JSON_ITEM, client, conf={"subject.name.strategy.type": "TOPIC_RECORD"}
    )
    records: list[tuple[bytes | None, bytes]] = []
    for i in range(8):
        item = {"_instance": f"avro-{i}", "comment": f"Great product {i}", "stars": i % 5}
        records.append((f"avro-{i}".encode(), await avro(item, _ctx(topic))))
    for i in range(8):
        post = {"_instance": f"js-{i}", "comment": f"Thanks for the tip {i}"}
        records.append((post["_instance"].encode(), await as_json(post, _ctx(topic))))
    for i in range(8):
        plain = {"_instance": f"plain-{i}", "comment": f"Nice write-up {i}"}
        records.append((plain["_instance"].encode(), orjson.dumps(plain)))
    avro_id = schema_id(records[0][1])
    assert avro_id is not None
    # A schema id the registry never issued, and an Avro payload cut short.
    records.append((b"bad-id", frame(987_654, b'{"_instance": "x"}')))
    records.append((b"bad-avro", records[0][1][:7]))
    await dep.produce(records)

    report = await dep.settle(len(records))
    assert report.unaccounted == 0, report.missing
    assert report.inputs == 26
    assert report.unexpected == 0

    letters = await dep.records(dep.settings.topics.dead_letter)
    by_key = {d["source"]["key"]: d for d in letters}
    assert sorted(by_key) == ["bad-avro", "bad-id"], [d["reason"] for d in letters]
    assert by_key["bad-id"]["code"] == "unknown_schema"
    assert "schema id 987654" in by_key["bad-id"]["reason"]
    assert by_key["bad-avro"]["code"] == "undecodable"
    assert f"id {avro_id}, AVRO" in by_key["bad-avro"]["reason"]

    # A registry-aware consumer: the library's JSON Schema deserializer reads every
    # activity record by the schema id it carries, registered for that topic.
    activity = dep.activity_topic("moderateComment")
    reader = await AsyncJSONDeserializer(
        None, schema_registry_client=client, conf={"subject.name.strategy.type": "TOPIC"}
    )
    decided: dict[str, dict[str, Any]] = {}
    ids = set()
    async for rec in read_topic(dep.bootstrap, activity):
        ids.add(schema_id(rec.value))
        value = await reader(rec.value, _ctx(activity))
        decided[value["instance"]] = value
    expected = {f"{kind}-{i}" for kind in ("avro", "js", "plain") for i in range(8)}
    assert set(decided) == expected
    registered = await client.get_latest_version(subject_of(activity))
    assert ids == {registered.schema_id}
    schema = json.loads(registered.schema.schema_str or "{}")
    assert {"decision", "reason"} <= set(schema["properties"]["call"]["properties"])
    # What the model saw of an Avro item is its decoded fields, as for plain JSON.
    assert decided["avro-3"]["call"]["decision"] in ("approve", "reject")
    assert decided["avro-3"]["call_id"].startswith(f"{topic}/")
    # The dead letters are framed too: their subject holds the dead-letter schema.
    raw_letters = [
        r.value async for r in read_topic(dep.bootstrap, dep.settings.topics.dead_letter)
    ]
    letter_subject = await client.get_latest_version(subject_of(dep.settings.topics.dead_letter))
    assert {schema_id(v) for v in raw_letters} == {letter_subject.schema_id}
    # Each letter's record key is the producer's key (it was null, the key only inside)
    keys = {r.key async for r in read_topic(dep.bootstrap, dep.settings.topics.dead_letter)}
    assert keys == {b"bad-id", b"bad-avro"}
    # The processor said what it registered (a new subject each, here) at start
    log = dep.proc.log_path.read_text(errors="replace")
    assert f"schema registry: subject {subject_of(activity)} registered, schema id" in log


def _spec_with(change: Callable[[dict[str, Any]], None], folder: Path) -> Path:
    doc = yaml.safe_load(DEFAULT_SPEC.read_text())
    changed = copy.deepcopy(doc)
    change(changed["tools"][0]["parameters"])  # moderateComment's
    path = folder / "agent.yaml"
    path.write_text(yaml.safe_dump(changed))
    return path


async def test_a_spec_that_breaks_an_activity_schema_is_refused_unless_forced(
    deploy: Deploy, registry: str, client: AsyncSchemaRegistryClient, tmp_path: Path
) -> None:
    dep = await deploy(STREAM_SCHEMA_REGISTRY_URL=registry, STREAM_SCHEMA_REGISTRY_OUTPUTS="true")
    await dep.produce_items([{"_instance": "first-1", "comment": "Lovely"}])
    assert (await dep.settle(1)).unaccounted == 0
    subject = subject_of(dep.activity_topic("moderateComment"))
    # (get_versions asks the registry each time; the client caches the latest version)
    before = len(await client.get_versions(subject))
    env = {"STREAM_SCHEMA_REGISTRY_URL": registry, "STREAM_SCHEMA_REGISTRY_OUTPUTS": "true"}

    # A new optional parameter: compatible, registered as the subject's next version.
    optional = _spec_with(lambda p: p["properties"].update(note={"type": "string"}), tmp_path)
    done = await dep.cli("schemas", "--register", STREAM_SPEC=str(optional), **env)
    assert done.returncode == 0, done.stderr
    assert f"{subject}\tid " in done.stdout
    assert len(await client.get_versions(subject)) == before + 1

    # `reason` becomes a number: old records no longer read with the new schema.
    (tmp_path / "broken").mkdir()
    broken = _spec_with(
        lambda p: p["properties"]["reason"].update(type="integer"), tmp_path / "broken"
    )
    refused = await dep.cli("schemas", "--register", STREAM_SPEC=str(broken), **env)
    assert refused.returncode == 2
    assert "not backward compatible" in refused.stderr
    assert subject in refused.stderr
    # `stream process` refuses the same spec at start, before it joins the group.
    start = await dep.cli(
        "process",
        STREAM_SPEC=str(broken),
        STREAM_LLM_BASE_URL=dep.settings.llm_base_url or "",
        STREAM_WEB_PORT=str(free_port()),
        STREAM_APP_ID="refused-start",
        **env,
    )
    assert start.returncode == 2, start.stderr[-2000:]
    assert start.stderr.strip().splitlines()[-1].startswith("stream: error: output schemas not")
    assert len(await client.get_versions(subject)) == before + 1

    forced = await dep.cli("schemas", "--register", "--force", STREAM_SPEC=str(broken), **env)
    assert forced.returncode == 0, forced.stderr
    assert len(await client.get_versions(subject)) == before + 2


def test_stream_registry_runs_one_in_the_foreground_until_sigterm() -> None:
    """`stream registry` as `stream broker`: the URL printed, schemas in memory."""
    import os
    import signal
    import subprocess
    import sys
    import urllib.error
    import urllib.request

    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "instanced_stream", "registry", "--port", str(port)],
        env={k: v for k, v in os.environ.items() if not k.startswith("STREAM_")},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert proc.stdout is not None
        ready = proc.stdout.readline()  # waited for: the line saying where it listens
        url = f"http://127.0.0.1:{port}/apis/ccompat/v7"
        assert f"ready at {url}" in ready, ready
        assert proc.stdout.readline().strip() == f"export STREAM_SCHEMA_REGISTRY_URL={url}"
        with urllib.request.urlopen(url + "/subjects", timeout=10) as answer:
            assert json.loads(answer.read()) == []  # in memory: every start is empty
        env = {k: v for k, v in os.environ.items() if not k.startswith("STREAM_")}
        env |= {"STREAM_SCHEMA_REGISTRY_URL": url, "STREAM_LLM_BASE_URL": "http://127.0.0.1:9/v1"}
        checked = subprocess.run(
            [sys.executable, "-m", "instanced_stream", "check", "--registry"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert checked.returncode == 0, checked.stderr
        assert f"registry {url}: answers, 0 subjects, compatibility " in checked.stdout
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    with pytest.raises(urllib.error.URLError, match="refused"):  # its JVM went with it
        urllib.request.urlopen(url + "/subjects", timeout=5)
