"""Console operations for people: publish a JSONL file, list the topics (`tail` has its own
module).

Not for the hot path: clear messages matter more than throughput here. A user mistake
(missing file, bad line, unknown topic, unreachable broker) is a one-line StreamError.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import AsyncIterator, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any, TextIO

import orjson
from aiokafka import TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError

from instanced_stream.core.spec import AgentSpec
from instanced_stream.core.wire import json_bytes
from instanced_stream.errors import KafkaUnreachable, StreamError
from instanced_stream.kafka import clients
from instanced_stream.kafka.topics import (
    ensure_product_topics,
    product_topics,
    read_topic,
    state_changelog,
)
from instanced_stream.settings import Settings

__all__ = [
    "Line",
    "ProduceReport",
    "TopicRow",
    "absent_topics",
    "budget_line",
    "connected",
    "format_record",
    "parse_lines",
    "produce",
    "render_topics",
    "require_topics",
    "resolve_topic",
    "topic_layout",
    "topics",
]

# aiokafka's own request timeout is 40 s; a person at a prompt should hear sooner.
CONNECT_TIMEOUT_S = 10.0
_KEEP = 10  # invalid lines listed: enough to find the mistake, never a flood
_COUNT_LIMIT = 20_000  # offsets of a topic `stream topics` still reads to count its records


@dataclass(frozen=True, slots=True)
class Line:
    """One JSONL line: its bytes and the key it goes with, or why it is refused."""

    number: int
    value: bytes
    key: str | None = None
    error: str | None = None


def parse_lines(lines: Iterable[bytes], key_field: str = "_instance") -> Iterator[Line]:
    for number, raw in enumerate(lines, 1):
        if not (value := raw.strip()):
            continue
        try:
            obj = orjson.loads(value)
        except orjson.JSONDecodeError as exc:
            yield Line(number, value, error=f"not JSON: {exc.msg} at column {exc.colno}")
            continue
        if not isinstance(obj, dict):
            yield Line(number, value, error=f"JSON {type(obj).__name__}, not an object")
            continue
        key = obj.get(key_field)
        # The ids the processor's intake accepts: non-blank strings, and numbers.
        if isinstance(key, int | float) and not isinstance(key, bool):
            key = str(key)
        yield Line(number, value, key if isinstance(key, str) and key.strip() else None)


@dataclass
class ProduceReport:
    topic: str
    sent: int = 0
    invalid: int = 0
    invalid_lines: list[tuple[int, str]] = field(default_factory=list)  # the first ones
    without_key: int = 0
    elapsed_s: float = 0.0
    rate: float = 0.0  # records per second achieved

    def summary(self) -> str:
        text = f"sent {_n(self.sent, 'record')} to {self.topic} in {self.elapsed_s:.2f}s "
        text += f"({self.rate:.0f}/s)"
        if self.without_key:
            text += f"; {self.without_key} without a key: the processor dead-letters those "
            text += "that have no '_instance' either (no_instance)"
        if self.invalid:
            shown = "; ".join(f"line {n}: {why}" for n, why in self.invalid_lines)
            text += f"; NOT SENT: {_n(self.invalid, 'invalid line')} ({shown})"
        return text


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


@contextlib.asynccontextmanager
async def connected(bootstrap: str, client: Any) -> AsyncIterator[Any]:
    """Starts an aiokafka client, turning "no broker there" into one clear line."""
    stop = client.close if isinstance(client, AIOKafkaAdminClient) else client.stop
    try:
        await asyncio.wait_for(client.start(), CONNECT_TIMEOUT_S)
    except (KafkaError, OSError, TimeoutError) as exc:
        with contextlib.suppress(Exception):
            await stop()
        raise KafkaUnreachable(
            f"cannot reach Kafka at {bootstrap} (check STREAM_BOOTSTRAP_SERVERS and, for TLS "
            "or SASL, the STREAM_KAFKA_* settings)"
        ) from exc
    try:
        yield client
    finally:
        await stop()


async def topic_layout(bootstrap: str) -> dict[str, list[int]]:
    """Every topic's partitions. One metadata request for all topics, never one that names
    a topic: with auto.create.topics.enable, naming a missing one creates it (1 partition)."""
    async with connected(bootstrap, clients.admin(bootstrap)) as admin:
        try:
            described = await admin.describe_topics(None)
        except KafkaError as exc:
            # a refused login (an expired token) may surface here, after start()
            raise KafkaUnreachable(
                f"cannot reach Kafka at {bootstrap}: {type(exc).__name__} (check "
                "STREAM_BOOTSTRAP_SERVERS and, for TLS or SASL, the STREAM_KAFKA_* settings)"
            ) from exc
    return {d["topic"]: sorted(p["partition"] for p in d["partitions"]) for d in described}


def absent_topics(prefix: str, looked_for: Sequence[str], missing: Sequence[str]) -> str:
    """Why a command that reads the product's topics has nothing to read: a prefix that
    matches nothing would otherwise read as "nothing missing"."""
    shown = ", ".join(missing)
    where = f"topic prefix {prefix!r} (STREAM_TOPIC_PREFIX)" if prefix else "no topic prefix"
    more = f" of the {len(looked_for)} looked for" if len(looked_for) > len(missing) else ""
    return (
        f"no such topic{'s' if len(missing) > 1 else ''}{more} with {where}: {shown}; check "
        "the prefix and STREAM_BOOTSTRAP_SERVERS (`stream topics` lists what the product "
        "expects)"
    )


async def require_topics(
    bootstrap: str, prefix: str, looked_for: Sequence[str], needed: Sequence[str] | None = None
) -> None:
    """StreamError (exit 2) when any of `needed` (default: all of `looked_for`) is not on
    the cluster; the message names every one of `looked_for` that is absent. An outcome
    topic a spec never wrote to (the review topic without a gate) may be absent: only
    what must exist is `needed`."""
    layout = await topic_layout(bootstrap)
    missing = [t for t in dict.fromkeys(looked_for) if t not in layout]
    if any(t not in layout for t in (looked_for if needed is None else needed)):
        raise StreamError(absent_topics(prefix, list(dict.fromkeys(looked_for)), missing))


def _open(path: Path) -> IO[bytes]:
    try:
        return Path(path).open("rb")
    except OSError as exc:
        raise StreamError(f"cannot read {path}: {exc.strerror}") from exc


async def produce(
    bootstrap: str,
    topic: str,
    path: Path,
    key_field: str = "_instance",
    rate: float | None = None,
    out: TextIO | None = None,
) -> ProduceReport:
    """Sends every valid line of a JSONL file; returns once the broker acked them all."""
    if rate is not None and rate <= 0:
        raise StreamError(f"--rate must be a positive number of records per second, not {rate}")
    out, report = out or sys.stderr, ProduceReport(topic)
    with _open(path) as handle:
        if topic not in await topic_layout(bootstrap):
            raise StreamError(f"topic {topic} does not exist (`stream topics --create`)")
        # Idempotent: a send retried after a lost ack is not written twice.
        producer = clients.producer(bootstrap)
        async with connected(bootstrap, producer):
            start = shown = time.monotonic()
            pending: list[asyncio.Future[Any]] = []
            number = 0
            try:
                for line in parse_lines(handle, key_field):
                    number, key = line.number, line.key
                    if line.error is not None:
                        report.invalid += 1
                        if len(report.invalid_lines) < _KEEP:
                            report.invalid_lines.append((number, line.error))
                        continue
                    report.without_key += key is None
                    queued = report.sent + len(pending)
                    if rate and (ahead := start + queued / rate - time.monotonic()) > 0:
                        await asyncio.sleep(ahead)
                    pending.append(
                        await producer.send(topic, line.value, key=key.encode() if key else None)
                    )
                    if len(pending) >= 500:  # bounded memory, whatever the file's size
                        report.sent += await _acked(pending)
                    if out.isatty() and time.monotonic() - shown > 0.2:
                        shown = time.monotonic()
                        out.write(f"\rsent {queued + 1}, invalid {report.invalid} ...")
                        out.flush()
                report.sent += await _acked(pending)
            except KafkaError as exc:
                raise StreamError(
                    f"the broker refused a record (read up to line {number}): {exc!r}"
                ) from exc
    report.elapsed_s = time.monotonic() - start
    report.rate = report.sent / report.elapsed_s if report.elapsed_s > 0 else 0.0
    out.write(("\r\x1b[K" if out.isatty() else "") + report.summary() + "\n")
    return report


async def _acked(pending: list[asyncio.Future[Any]]) -> int:
    await asyncio.gather(*pending)
    done = len(pending)
    pending.clear()
    return done


def resolve_topic(settings: Settings, name: str) -> str:
    """Short product names (items, deadletter, activity.<tool>, stream.done, changelog)
    get the prefix; anything else is a full topic name, taken as it is."""
    t = settings.topics
    stream = f"{t.prefix}stream."
    # Every `<prefix>stream.<x>` the product knows, by x: follows Topics as it grows.
    known = {v.removeprefix(stream): v for v in map(str, vars(t).values()) if v.startswith(stream)}
    if name in (settings.input_topic, "items", "input"):
        return t.input
    if name == "changelog":
        return state_changelog(settings)
    if name in known:
        return known[name]
    return t.prefix + name if name.startswith(("activity.", "stream.")) else name


def _text(raw: bytes) -> str:
    """Bytes as one printable line: bad UTF-8 and control characters come out escaped."""
    text = raw.decode("utf-8", "backslashreplace")
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _show(value: Any, width: int = 80) -> str:
    bare = isinstance(value, str) and value.isprintable() and value and " " not in value
    text = str(value) if bare else orjson.dumps(value, default=str).decode()
    return text if len(text) <= width else text[: width - 1] + "…"


def _pick(record: dict[str, Any], *names: str) -> list[tuple[str, Any]]:
    return [(name, record.get(name)) for name in names]


def _fields(v: dict[str, Any]) -> tuple[str, list[tuple[str, Any]]] | None:
    """The kind of a product record and its telling fields, most useful first."""

    def sub(name: str) -> dict[str, Any]:
        found = v.get(name)
        return found if isinstance(found, dict) else {}

    if {"call_id", "call", "tool"} <= v.keys():
        args = [(k, x) for k, x in sub("call").items() if not k.startswith("_")]
        advice = [("advice", sub("advice").get("option"))]
        return "activity", [*_pick(v, "tool", "instance"), *args, *advice, *_pick(v, "review")]
    if {"code", "reason", "scope"} <= v.keys():
        at = "/".join(str(x) for _, x in _pick(sub("source"), "topic", "partition", "offset"))
        return "deadletter", [*_pick(v, "code", "reason", "instance"), ("source", at)]
    if {"opinions", "consensus"} <= v.keys():
        council = _pick(sub("consensus"), "option", "score")
        return "advice", [*_pick(v, "instance"), *council, *_pick(v, "divergent")]
    if {"status", "turns", "state"} <= v.keys():
        return "done", _pick(v, "instance", "status", "turns", "reason")
    if {"instance", "reason", "batch"} <= v.keys():
        return "noaction", _pick(v, "instance", "reason")
    return None


def summarise_value(value: bytes | None, width: int = 200) -> str:
    """A record value on one line; never raises, whatever the bytes."""
    if value is None:
        return "(tombstone)"
    try:
        data = orjson.loads(json_bytes(value))  # a framed output record shows its JSON
    except orjson.JSONDecodeError:
        return "(not JSON) " + _text(value)[:width]
    known = _fields(data) if isinstance(data, dict) else None
    if known is None:
        return _show(data, width)
    text = " ".join([known[0]] + [f"{k}={_show(x)}" for k, x in known[1] if x is not None])
    return text if len(text) <= width else text[: width - 1] + "…"


def format_record(record: Any, as_json: bool = False) -> str:
    """One line per record (anything with aiokafka ConsumerRecord's attributes)."""
    key, value = record.key, record.value
    if not as_json:
        when = datetime.fromtimestamp(record.timestamp / 1000, UTC).isoformat(" ", "milliseconds")
        shown_key = "-" if key is None else _text(key)
        return f"{when[:23]}  {record.partition}:{record.offset}  {shown_key}  " + (
            summarise_value(value)
        )
    out: dict[str, Any] = {"topic": record.topic, "partition": record.partition}
    out |= {"offset": record.offset, "timestamp_ms": record.timestamp}
    out["key"] = None if key is None else key.decode("utf-8", "backslashreplace")
    try:
        out["value"] = None if value is None else orjson.loads(json_bytes(value))
    except orjson.JSONDecodeError:
        out |= {"value": None, "raw": value.decode("utf-8", "backslashreplace")}
    return orjson.dumps(out).decode()


@dataclass(frozen=True, slots=True)
class TopicRow:
    name: str
    partitions: int  # 0: the topic does not exist
    records: int  # records held now (read committed); offsets when `exact` is False
    created: bool = False
    group: str | None = None  # the processors' group, for the input topic only
    committed: dict[int, int] | None = None  # None: the group never committed
    lag: dict[int, int] = field(default_factory=dict)
    exact: bool = True  # False: too many to count, `records` holds the offsets


async def topics(
    bootstrap: str,
    settings: Settings,
    spec: AgentSpec,
    create: bool = False,
    partitions: int | None = None,
) -> list[TopicRow]:
    """The product's topics with their sizes, and the processors' lag on the input."""
    if partitions is not None and partitions < 1:
        raise StreamError(f"--partitions must be 1 or more, not {partitions}")
    names = [*product_topics(settings, spec), settings.topics.context, state_changelog(settings)]
    names, before = list(dict.fromkeys(names)), await topic_layout(bootstrap)
    if create:
        chosen = settings.model_copy(update={"partitions": partitions or settings.partitions})
        await ensure_product_topics(bootstrap, chosen, spec)
    group, source = settings.topic_prefix + settings.app_id, settings.topics.input
    layout = before
    for _ in range(50) if create else ():
        # A new topic reaches the broker's metadata cache a moment after its creation.
        if set(names) <= (layout := await topic_layout(bootstrap)).keys():
            break
        await asyncio.sleep(0.2)
    parts = {n: layout[n] for n in names if n in layout}
    ends: dict[TopicPartition, int] = {}
    starts: dict[TopicPartition, int] = {}
    if parts:
        consumer = clients.consumer(bootstrap)
        async with connected(bootstrap, consumer):
            tps = [TopicPartition(n, p) for n in parts for p in parts[n]]
            ends, starts = await consumer.end_offsets(tps), await consumer.beginning_offsets(tps)
    committed = await _committed(bootstrap, group, source, parts.get(source, []))
    rows = []
    for name in names:
        end = {p: ends[TopicPartition(name, p)] for p in parts.get(name, [])}
        extra: dict[str, Any] = {}
        if name == source:
            lag = {p: e - committed.get(p, 0) for p, e in end.items()}
            extra = {"group": group, "committed": committed or None, "lag": lag}
        created = name in parts and name not in before
        held = sum(e - starts[TopicPartition(name, p)] for p, e in end.items())
        # Offsets are not records: each transaction adds a commit marker, and aborted
        # records hold offsets too. Count what a read_committed reader gets, where cheap.
        exact = held <= _COUNT_LIMIT
        count = sum([1 async for _ in read_topic(bootstrap, name)]) if exact and held else held
        rows.append(TopicRow(name, len(end), count, created, exact=exact, **extra))
    return rows


async def _committed(bootstrap: str, group: str, topic: str, parts: list[int]) -> dict[int, int]:
    """The group's committed offsets; on a fresh broker the offsets topic is still being
    created and the coordinator answers "not available" for a moment: ask again."""
    if not parts:
        return {}
    admin = clients.admin(bootstrap)
    async with connected(bootstrap, admin):
        for attempt in range(40):
            try:
                tps = [TopicPartition(topic, p) for p in parts]
                offsets = await admin.list_consumer_group_offsets(group, partitions=tps)
                return {tp.partition: m.offset for tp, m in offsets.items() if m.offset >= 0}
            except KafkaError as exc:
                if not exc.retriable or attempt == 39:
                    raise StreamError(f"cannot read group {group}'s offsets: {exc!r}") from exc
                await asyncio.sleep(0.25)
    return {}


def render_topics(rows: list[TopicRow]) -> str:
    """An aligned table; the input topic's line says whose lag it is, per partition."""
    table = [("topic", "partitions", "records", "lag", "")]
    for r in rows:
        lag, note = "", "created" if r.created else ""
        if r.partitions == 0:
            note = "missing (`stream topics --create`)"
        elif r.group is not None:
            lag = str(sum(r.lag.values()))
            who = f"group {r.group}" if r.committed is not None else f"no group {r.group} yet"
            per = " ".join(f"{p}:{n}" for p, n in sorted(r.lag.items()))
            note = ", ".join(x for x in (note, who, f"lag by partition {per}") if x)
        records = str(r.records) if r.exact else f"~{r.records}"
        table.append((r.name, str(r.partitions), records, lag, note))
    widths = [max(len(row[i]) for row in table) for i in range(4)]
    lines = [
        "  ".join(
            [row[0].ljust(widths[0])]
            + [c.rjust(w) for c, w in zip(row[1:4], widths[1:], strict=True)]
        )
        + (f"  {row[4]}" if row[4] else "")
        for row in table
    ]
    if not all(r.exact for r in rows):
        lines.append(
            f"~: offsets, not records (over {_COUNT_LIMIT} to count here; transaction "
            "markers and aborted records hold offsets too)"
        )
    return "\n".join(lines)


def budget_line(budget: dict[str, Any] | None, page: str) -> str:
    """The spend ceiling as a processor keeps it: its rate, what is left, when it is met."""
    if not budget or budget.get("usd_per_hour") is None:
        return f"budget: no processor page answered at {page}"
    met = budget.get("met_in_s")
    when = (
        "paced now: input held"
        if budget.get("paced") or met == 0
        else ("not at this rate" if met is None else f"met in {met:.0f} s at this rate")
    )
    return (
        f"budget: spend {budget['spend_usd_per_hour']:.4f} USD/h of "
        f"{budget['usd_per_hour']:.4f}, left {budget['headroom_usd_per_hour']:.4f} USD/h; {when}"
    )
