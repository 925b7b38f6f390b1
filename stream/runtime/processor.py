"""The processor: a faust-streaming app that windows items into batches, asks the model
once per batch, and publishes the validated per-instance calls.

Flow per record: track its offset -> parse (bad records: dead letter) -> window ->
batch task (bounded number in flight) -> solve -> publish in batch order, await acks ->
finish offsets (acked to faust in offset order, so commits never pass unfinished work).
"""

from __future__ import annotations

import asyncio
import base64
import logging
import os
import secrets
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, cast

import faust
import mode
import orjson
from pydantic import ValidationError

from stream.core.advice import Consensus, gate, summarise
from stream.core.messages import (
    ActivityRecord,
    AdviceRecord,
    ApprovalRecord,
    BatchRef,
    Call,
    DeadLetter,
    DoneRecord,
    NoActionRecord,
    OpinionRecord,
    ResultRecord,
    SourcePosition,
    TraceEntry,
)
from stream.core.prompt import Instance, PromptBuilder
from stream.core.solve import Answer, Outcome, Solver
from stream.core.spec import NO_ACTION, AgentSpec
from stream.core.state import TableStore, read_path
from stream.core.tokenizer import Tokenizer
from stream.core.validate import Validator
from stream.core.workflow import Turn, Workflow
from stream.errors import BadRecord, SpecError
from stream.llm.client import LLM
from stream.llm.limiter import Limiter
from stream.ops.metrics import Metrics
from stream.ops.web import WebServer
from stream.runtime.context import ContextFollower, Messages, apply_context
from stream.runtime.intake import parse_item
from stream.runtime.offsets import Entry, OffsetLedger
from stream.runtime.publish import OutRecord, Publisher, PublishError
from stream.runtime.security import faust_credentials
from stream.runtime.windowing import Windower
from stream.settings import Settings, Topics
from stream.testing.faults import crash_point

__all__ = ["Pipeline", "build_app", "call_id", "resolve_api_key"]

log = logging.getLogger("stream.processor")

_T = TypeVar("_T")

_BATCH_TRIES = 3
_RAW_KEEP = 64 * 1024
_REQUEST_OVERHEAD = 64  # chat framing, the advisors' control message
_MIN_ROOM = 64  # prompt tokens a request needs for at least one small instance
_OUTPUT_MARGIN = 1.25  # answers vary: keep a quarter of the output budget spare


def call_id(source: SourcePosition, tool: str, ordinal: int, turn: int = 1) -> str:
    """Same item, turn, tool and ordinal: same id, however often the batch is redone."""
    step = "" if turn == 1 else f"t{turn}/"
    return f"{source.topic}/{source.partition}/{source.offset}/{step}{tool}/{ordinal}"


def resolve_api_key(settings: Settings, spec: AgentSpec) -> str:
    if settings.llm_api_key is not None:
        return settings.llm_api_key.get_secret_value()
    if spec.model.api_key_file is not None:
        return spec.model.api_key_file.read_text().strip()
    key = os.environ.get(spec.model.api_key_env)
    if key:
        return key
    if spec.model.base_url is None:
        return "simulator"  # the bundled simulator takes any key
    raise SpecError(
        f"no API key: set {spec.model.api_key_env}, STREAM_LLM_API_KEY or model.api_key_file"
    )


def _summary(call: Call) -> str:
    """A call in a few words for people: its tool and its chosen values."""
    values = [str(v) for v in call.arguments.values() if isinstance(v, str) and len(v) < 24]
    return f"{call.tool}({', '.join(values[:2])})"


def _position(source: SourcePosition) -> tuple[str, int, int]:
    return (source.topic, source.partition, source.offset)


def _dumps(record: Any) -> bytes:
    return orjson.dumps(record.model_dump(mode="json", by_alias=True, exclude_none=True))


class _Item:
    __slots__ = ("entry", "instance", "tokens")

    def __init__(self, instance: Instance, entry: Entry | None, tokens: int) -> None:
        self.instance = instance
        self.entry = entry
        self.tokens = tokens


class Pipeline:
    """Everything between a delivered record and its acknowledged outcome."""

    def __init__(self, settings: Settings, spec: AgentSpec, llm: LLM, publisher: Publisher) -> None:
        self.settings = settings
        self.spec = spec
        self.topics: Topics = settings.topics
        self.llm = llm
        self.publisher = publisher
        self.solver = self._solver(spec)
        self.follower: ContextFollower | None = None
        self.workflow: Workflow | None = None
        self._queued_turns: set[str] = set()
        self.metrics = Metrics(
            spec.model.price_input_per_million, spec.model.price_output_per_million
        )
        llm.listener = self.metrics
        self.limiter = Limiter(
            spec.window.max_in_flight,
            adaptive=spec.window.adaptive,
            on_change=self.metrics.on_limit,
        )
        llm.limiter = self.limiter
        self.web: WebServer | None = None
        self.started = False
        self.ledger = OffsetLedger()
        self.tokenizer = Tokenizer(spec.model.name)
        self.item_budget = self._item_budget(spec)
        self.output_per_item = float(spec.window.output_tokens_per_item)
        self.windower: Windower[_Item] = Windower(
            max_items=spec.window.max_items,
            max_wait_s=spec.window.max_wait_ms / 1000,
            max_tokens=self.item_budget,
            on_close=self._launch,
            tokens_of=lambda item: item.tokens,
            capacity=self._output_capacity,
        )
        self.worker = secrets.token_hex(3)
        self.batches = 0
        self.stats: Counter[str] = Counter()
        self._tasks: set[asyncio.Task[None]] = set()
        self._last_publish: asyncio.Future[None] | None = None
        # Set by the app: crashes the worker so the group redelivers (see _run).
        self.on_fatal: Callable[[BaseException], Awaitable[None]] | None = None

    def reconfigure(self, spec: AgentSpec, refused: list[tuple[str, str]]) -> None:
        """Takes a new spec (from the context topic); batches in flight finish as asked."""
        for key, reason in refused:
            log.error("context message %s refused: %s", key, reason)
        self.stats["context_refused"] = len(refused)
        self.spec = spec
        self.solver = self._solver(spec)
        self.item_budget = self.windower.max_tokens = self._item_budget(spec)

    def _item_budget(self, spec: AgentSpec) -> int:
        """Prompt tokens left for instances once the static prefix is counted."""
        fixed = self.tokenizer.count(self.solver.prompt.system) + _REQUEST_OVERHEAD
        room = spec.window.max_input_tokens - fixed
        if room < _MIN_ROOM:
            raise SpecError(
                f"window.max_input_tokens is {spec.window.max_input_tokens}, but the "
                f"instructions, tools and advisors alone take about {fixed} tokens: "
                f"raise it to at least {fixed + _MIN_ROOM}"
            )
        return room

    def _output_capacity(self) -> int:
        """Instances whose expected answers fit the output budget (measured as we go)."""
        window = self.spec.window
        budget = window.max_output_tokens or self.spec.model.max_output_tokens
        if budget is None:
            return window.max_items
        return max(1, int(budget / (self.output_per_item * _OUTPUT_MARGIN)))

    def _learn_output(self, outcome: Outcome, instances: int) -> None:
        if outcome.requests and instances:
            per_item = outcome.completion_tokens / instances
            self.output_per_item += 0.2 * (per_item - self.output_per_item)

    def _solver(self, spec: AgentSpec) -> Solver:
        return Solver(
            self.llm,
            PromptBuilder(spec),
            Validator(spec),
            self.settings.max_attempts,
            spec.advice.max_consults,
        )

    async def start(self) -> None:
        await self.publisher.start()
        self.windower.start()
        if self.web is not None:
            try:
                await self.web.start()
            except OSError as exc:
                # A busy port must not stop the stream: it only costs the page and probes.
                log.warning("web server not started on port %d: %s", self.web.port, exc)
        self.started = True
        if self.follower is not None:
            self.follower.start()

    async def stop(self) -> None:
        self.started = False
        if self.web is not None:
            await self.web.stop()
        if self.follower is not None:
            await self.follower.stop()
        await self.windower.stop()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.publisher.stop()
        await self.llm.close()

    async def offer(
        self,
        value: bytes | None,
        key: bytes | None,
        source: SourcePosition,
        ack: Callable[[], object],
    ) -> None:
        """Takes one delivered record. Awaits while all batch slots are busy."""
        entry = self.ledger.track((source.topic, source.partition), source.offset, ack)
        self.stats["items_in"] += 1
        self.metrics.items_in.inc()
        try:
            instance = parse_item(value, key, source, self.settings.max_record_bytes)
            assert value is not None  # parse_item refuses a missing value
            tokens = self.tokenizer.count(value.decode("utf-8", "replace"))
            if tokens > self.item_budget:
                raise BadRecord(
                    "too_large",
                    f"record is about {tokens} tokens; a request has room for {self.item_budget}"
                    " (window.max_input_tokens less the instructions, tools and advisors)",
                )
        except BadRecord as exc:
            letter = DeadLetter(
                code=exc.code,
                reason=exc.message,
                scope="item",
                source=source,
                # Capped: a dead letter must never be too large for the broker itself.
                raw_b64=base64.b64encode(value[:_RAW_KEEP]).decode() if value else None,
                raw_size=len(value) if value is not None else None,
            )
            log.warning(
                "dead letter %s at %s/%d/%d: %s",
                exc.code,
                source.topic,
                source.partition,
                source.offset,
                exc.message,
                extra={
                    "code": exc.code,
                    "topic": source.topic,
                    "partition": source.partition,
                    "offset": source.offset,
                },
            )
            await self.publisher.publish([self._letter_record(letter)])
            self.stats[f"dead_letter.{exc.code}"] += 1
            self.ledger.finish(entry)
            return
        if self.workflow is not None:
            instance = self.workflow.admit(instance)
        await self.windower.add(_Item(instance, entry, tokens))

    async def _launch(self, items: list[_Item], reason: str) -> None:
        await self.limiter.acquire()
        self.batches += 1
        batch_id = f"{self.worker}-{self.batches}"
        previous = self._last_publish
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._last_publish = turn
        self.stats[f"window_close.{reason}"] += 1
        self.metrics.observe_batch(len(items), reason)
        self.metrics.batch_started()
        task = asyncio.create_task(self._run(batch_id, items, previous, turn), name=batch_id)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(
        self,
        batch_id: str,
        items: list[_Item],
        previous: asyncio.Future[None] | None,
        turn: asyncio.Future[None],
    ) -> None:
        try:
            records = await self._outcome_records(batch_id, items)
            if previous is not None:
                # Publish in batch order so each instance's outputs keep its input order.
                await asyncio.shield(previous)
            await self._deliver(batch_id, items, records)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # every fallback failed: never let a batch end unseen
            # Its items would hold their partitions' commits forever while the worker
            # looked healthy. Crash instead: the group redoes them from the last commit.
            log.critical(
                "batch %s could not be delivered, stopping the worker: %r",
                batch_id,
                exc,
                extra={"batch_id": batch_id},
            )
            if self.on_fatal is None:
                raise
            await self.on_fatal(exc)
        finally:
            if not turn.done():
                turn.set_result(None)
            self.limiter.release()
            self.metrics.batch_ended()

    async def _deliver(self, batch_id: str, items: list[_Item], records: list[OutRecord]) -> None:
        """Publishes a batch's outcomes, then acks its items. An unexpected error is
        retried; after the last try the items are dead-lettered with it instead."""

        async def publish() -> None:
            crash_point("after_llm")  # tests only: STREAM_CRASH_AT (stream/faults.py)
            # Items of partitions revoked meanwhile are being redone by their new owner.
            gone = {_position(i.instance.source) for i in items if i.entry and i.entry.dropped}
            await self._publish_or_dead_letter(
                batch_id, items, [r for r in records if r.origin not in gone]
            )
            crash_point("after_publish")  # tests only: published, not yet acked

        error = await self._retried(batch_id, "delivering", publish)
        if isinstance(error, Exception):
            await self.publisher.publish(
                self._internal_errors(batch_id, items, error, _BATCH_TRIES)
            )
        for item in items:
            self._queued_turns.discard(item.instance.id)
            if item.entry is not None:
                self.ledger.finish(item.entry)

    async def _publish_or_dead_letter(
        self, batch_id: str, items: list[_Item], records: list[OutRecord]
    ) -> None:
        try:
            await self.publisher.publish(records)
        except PublishError as exc:  # the broker refuses them for good (e.g. too large)
            log.error(
                "batch %s: %s; dead-lettering its items",
                batch_id,
                exc.message,
                extra={"batch_id": batch_id},
            )
            await self.publisher.publish(self._internal_errors(batch_id, items, exc, 1))

    async def _outcome_records(self, batch_id: str, items: list[_Item]) -> list[OutRecord]:
        """Solves the batch; an unexpected error retries it, then dead-letters its items
        with the error, so nothing of the batch is acked without an outcome."""
        instances = [item.instance for item in items]

        async def solve() -> list[OutRecord]:
            outcome = await self.solver.solve(instances)
            self._learn_output(outcome, len(instances))
            return self._records(batch_id, outcome)

        records = await self._retried(batch_id, "solving", solve)
        if isinstance(records, Exception):
            return self._internal_errors(batch_id, items, records, _BATCH_TRIES)
        return records

    async def _retried(
        self, batch_id: str, what: str, step: Callable[[], Awaitable[_T]]
    ) -> _T | Exception:
        """Runs `step` up to _BATCH_TRIES times; its result, or the last error. A bug
        must cost a retry, never an item: the caller dead-letters with the error."""
        error: Exception = RuntimeError(f"{what} was not tried")
        for attempt in range(1, _BATCH_TRIES + 1):
            try:
                return await step()
            except Exception as exc:
                log.exception(
                    "batch %s: %s failed (try %d of %d)",
                    batch_id,
                    what,
                    attempt,
                    _BATCH_TRIES,
                    extra={"batch_id": batch_id},
                )
                error = exc
                await asyncio.sleep(0.5 * attempt)
        return error

    def _internal_errors(
        self, batch_id: str, items: list[_Item], error: Exception, attempts: int
    ) -> list[OutRecord]:
        return [
            self._letter_record(
                DeadLetter(
                    code="internal_error",
                    reason=f"processing failed: {error!r}"[:2000],
                    scope="item",
                    instance=item.instance.id,
                    source=item.instance.source,
                    attempts=attempts,
                    batch_id=batch_id,
                )
            )
            for item in items
        ]

    def _records(self, batch_id: str, outcome: Outcome) -> list[OutRecord]:
        self.stats["llm_requests"] += outcome.requests
        self.stats["prompt_tokens"] += outcome.prompt_tokens
        self.stats["completion_tokens"] += outcome.completion_tokens
        self.stats["cached_tokens"] += outcome.cached_tokens
        self.stats["consults"] += outcome.consults
        self.metrics.observe_tokens(
            outcome.prompt_tokens,
            outcome.completion_tokens,
            outcome.cached_tokens,
            len({id(a.instance) for a in outcome.answers}),
        )
        self.stats["stray_opinions"] += outcome.stray_opinions
        out: list[OutRecord] = []
        # Keep input order: answers arrive grouped by ask, not by offset.
        for answer in sorted(outcome.answers, key=lambda a: a.instance.source.offset):
            out.extend(self._answer_records(batch_id, answer))
        for refusal, owner, attempt in outcome.refusals:
            out.append(
                self._letter_record(
                    DeadLetter(
                        code=refusal.code,
                        reason=refusal.reason,
                        scope="call",
                        instance=owner.id if owner else None,
                        source=owner.source if owner else None,
                        call=refusal.call,
                        attempts=attempt,
                        batch_id=batch_id,
                    )
                )
            )
            self.stats[f"refused.{refusal.code}"] += 1
        for miss in outcome.unanswered:
            out.append(
                self._letter_record(
                    DeadLetter(
                        code=miss.code,
                        reason=miss.reason,
                        scope="item",
                        instance=miss.instance.id,
                        source=miss.instance.source,
                        attempts=miss.attempts,
                        batch_id=batch_id,
                    )
                )
            )
            self.stats[f"dead_letter.{miss.code}"] += 1
        return out

    def _answer_records(self, batch_id: str, answer: Answer) -> list[OutRecord]:
        inst = answer.instance
        key = inst.id.encode()
        origin = _position(inst.source)
        batch = BatchRef(id=batch_id, size=answer.size, token=answer.token, attempt=answer.attempt)
        advice: dict[str, Any] | None = None
        consensus: Consensus | None = None
        opinions: list[OpinionRecord] = []
        if self.spec.advisors:
            opinions, consensus = summarise(self.spec, answer.opinions)
            advice = {
                **consensus.as_dict(),
                "divergent": consensus.divergence >= self.spec.advice.divergence_alert,
                "votes": {o.advisor: o.votes for o in opinions},
                "consulted": answer.consulted,
            }
        # The model addressed a token; the world gets the producer's id back.
        ordinals: Counter[str] = Counter()
        calls: list[tuple[str, Call]] = []
        for call in answer.calls:
            calls.append(
                (
                    call_id(inst.source, call.tool, ordinals[call.tool], inst.turn),
                    call.model_copy(update={"instance": inst.id}),
                )
            )
            ordinals[call.tool] += 1
        turn = (
            self.workflow.turn(inst, calls, batch, answer.opinions)
            if self.workflow
            else Turn(run=[cid for cid, _ in calls])
        )
        records: list[OutRecord] = []
        reviewed: list[str] = []
        for cid, call in calls:
            if call.tool == NO_ACTION:
                rec: Any = NoActionRecord(
                    instance=inst.id,
                    reason=str(call.arguments.get("reason", "")),
                    source=inst.source,
                    batch=batch,
                )
                records.append(OutRecord(self.topics.no_action, key, _dumps(rec), origin))
                self.stats["no_action"] += 1
                continue
            tool = self.spec.tool(call.tool)
            assert tool is not None  # the validator admits known tools only
            if tool.kind == "latent":
                # The model answered it itself: never published; with `_outputPath` the
                # workflow wrote its arguments to state.
                self.stats["latent_calls"] += 1
                continue
            if cid not in turn.run:
                continue  # proposed (lazy plan): runs when approved
            review = gate(call, consensus, self.spec.advice) if consensus else None
            if review:
                reviewed.append(cid)
                self.stats["reviewed"] += 1
            records.append(self._call_record(cid, call, inst, batch, advice, review, turn.trace))
        if turn.proposal is not None:
            records.append(OutRecord(self.topics.proposals, key, _dumps(turn.proposal), origin))
            self.stats["proposals"] += 1
        if turn.done is not None:
            records.append(OutRecord(self.topics.done, key, _dumps(turn.done), origin))
            self.stats["done"] += 1
        if not records:
            # Only latent calls: the instance needs no action, and says so on the record.
            rec = NoActionRecord(
                instance=inst.id, reason="only latent calls", source=inst.source, batch=batch
            )
            records.append(OutRecord(self.topics.no_action, key, _dumps(rec), origin))
        first = next((c for _, c in calls if c.tool != NO_ACTION), None)
        self.metrics.decisions.append(
            {
                "instance": inst.id,
                "decision": _summary(first) if first else "no action",
                "consensus": {"option": consensus.option, "score": round(consensus.score, 2)}
                if consensus
                else None,
                "divergent": bool(advice and advice["divergent"]),
                "votes": advice["votes"] if advice else {},
            }
        )
        if consensus is not None:
            note = AdviceRecord(
                instance=inst.id,
                turn=inst.turn,
                source=inst.source,
                batch=batch,
                opinions=opinions,
                consensus=consensus.as_dict(),
                divergent=bool(advice and advice["divergent"]),
                consulted=answer.consulted,
                call_ids=[cid for cid, _ in calls],
                reviewed=reviewed,
            )
            records.append(OutRecord(self.topics.advice, key, _dumps(note), origin))
            self.stats["advisor_opinions"] += len(opinions)
            self.stats["divergent"] += int(note.divergent)
        return records

    def _call_record(
        self,
        cid: str,
        call: Call,
        inst: Instance,
        batch: BatchRef,
        advice: dict[str, Any] | None,
        review: str | None,
        trace: list[TraceEntry],
    ) -> OutRecord:
        tool = self.spec.tool(call.tool)
        assert tool is not None
        rec = ActivityRecord(
            call_id=cid,
            tool=call.tool,
            instance=inst.id,
            call=call,
            context=self._context(inst, call.scopes),
            source=inst.source,
            batch=batch,
            model=self.llm.model,
            advice=advice,
            review=review,
            turn=inst.turn,
            trace=trace,
        )
        self.stats[f"calls.{call.tool}"] += 1
        self.metrics.calls_out.labels(call.tool).inc()
        topic = self.topics.review if review else tool.topic or self.topics.activity(tool.name)
        return OutRecord(topic, inst.id.encode(), _dumps(rec), _position(inst.source))

    def _context(self, inst: Instance, scopes: list[str] | None) -> list[dict[str, Any]]:
        """Only what the call imports, and only from its own instance plus globals."""
        if not scopes:
            return []
        context: list[dict[str, Any]] = []
        if "input" in scopes:
            context += [m.model_dump(by_alias=True, exclude_none=True) for m in self.spec.inputs]
            context.append({**inst.payload, "_instance": inst.id})
        state = self._state_of(inst)
        for scope in scopes:
            if scope == "†state" or scope.startswith("†state."):
                value = read_path(state, scope)
                if value is not None:
                    shown = value if scope == "†state" else {scope.split(".")[-1]: value}
                    context.append(
                        {
                            "type": "state",
                            "_instance": inst.id,
                            "scope": scope,
                            **(shown if isinstance(shown, dict) else {"value": shown}),
                        }
                    )
        return context

    def _state_of(self, inst: Instance) -> dict[str, Any]:
        if self.workflow is not None:
            st = self.workflow.store.get(inst.id)
            if st is not None:
                return st.state
        return inst.state or {}

    async def on_result(self, value: bytes | None, entry: Entry | None) -> None:
        """An activity's result for an awaited call: into state, then maybe a next turn."""
        try:
            rec = ResultRecord.model_validate_json(value or b"")
        except ValidationError as exc:
            log.error("not a result record: %s", exc.errors()[:1])
            self.stats["results_bad"] += 1
        else:
            if self.workflow is not None:
                nxt, done = self.workflow.on_result(rec)
                self.stats["results"] += 1
                await self._after_state_change(rec.instance, nxt, done)
        if entry is not None:
            self.ledger.finish(entry)

    async def on_approval(self, value: bytes | None, entry: Entry | None) -> None:
        """A person approved or rejected a lazy plan's proposal."""
        try:
            rec = ApprovalRecord.model_validate_json(value or b"")
        except ValidationError as exc:
            log.error("not an approval record: %s", exc.errors()[:1])
            self.stats["approvals_bad"] += 1
        else:
            if self.workflow is not None:
                proposal, done = self.workflow.on_approval(rec)
                st = self.workflow.store.get(rec.instance)
                records = []
                if st is not None and st.source is not None and proposal:
                    inst = Instance(st.instance, st.input, st.source, 0, st.state, st.turn)
                    batch = BatchRef(id=f"{self.worker}-approved", size=1, token="", attempt=1)
                    for stored in proposal:
                        cid = stored["call_id"]
                        call = Call.model_validate(
                            {k: v for k, v in stored.items() if k != "call_id"}
                        )
                        if self.spec.tool(call.tool) and call.tool != NO_ACTION:
                            records.append(
                                self._call_record(
                                    cid, call, inst, batch, None, None, list(st.trace)
                                )
                            )
                await self.publisher.publish(records)
                await self._after_state_change(rec.instance, None, done)
        if entry is not None:
            self.ledger.finish(entry)

    async def _after_state_change(
        self, instance: str, nxt: Instance | None, done: DoneRecord | None
    ) -> None:
        if done is not None:
            await self.publisher.publish(
                [
                    OutRecord(
                        self.topics.done,
                        instance.encode(),
                        _dumps(done),
                        _position(done.source) if done.source else None,
                    )
                ]
            )
            self.stats["done"] += 1
        if nxt is not None:
            await self.enqueue_turn(nxt)

    async def enqueue_turn(self, inst: Instance) -> None:
        """An instance ready for its next turn joins the window like any item."""
        if inst.id in self._queued_turns:
            return
        self._queued_turns.add(inst.id)
        self.stats["turns"] += 1
        shown = orjson.dumps([inst.payload, inst.state]).decode()
        await self.windower.add(_Item(inst, None, self.tokenizer.count(shown)))

    async def expire(self) -> None:
        if self.workflow is None:
            return
        for nxt, done in self.workflow.expire(time.time()):
            await self._after_state_change(
                nxt.id if nxt else (done.instance if done else ""), nxt, done
            )

    def _letter_record(self, letter: DeadLetter) -> OutRecord:
        self.metrics.dead_letters.labels(letter.code).inc()
        key = letter.instance.encode() if letter.instance else None
        origin = _position(letter.source) if letter.source else None
        return OutRecord(self.topics.dead_letter, key, _dumps(letter), origin)


def _cap_commits(app: faust.App, ledger: OffsetLedger, tracked: set[str]) -> None:
    """Routes every commit faust computes for the tracked topics through the ledger."""
    consumer: Any = app.consumer  # faust exposes no public hook for this
    proposed = consumer._new_offset

    def capped(tp: Any) -> int | None:
        offset = proposed(tp)
        if tp.topic not in tracked:
            return cast(int | None, offset)
        return ledger.cap((tp.topic, tp.partition), offset)

    consumer._new_offset = capped


def build_app(
    settings: Settings,
    spec: AgentSpec,
    bootstrap: str,
    llm_url: str,
    context: tuple[Messages, dict[int, int]] | None = None,
) -> faust.App:
    """The processor app. `context`: what the context topic held at start, and where each
    of its partitions ended, so the pipeline follows it from there."""
    topics = settings.topics
    app = faust.App(
        settings.topic_prefix + settings.app_id,
        broker=f"kafka://{bootstrap}",
        key_serializer="raw",
        value_serializer="raw",
        store="memory://",
        datadir=str(settings.data_dir),
        consumer_auto_offset_reset="earliest",
        broker_commit_interval=settings.commit_interval,
        broker_session_timeout=settings.session_timeout_s,
        broker_heartbeat_interval=settings.session_timeout_s / 5,
        # Waiting for in-flight batches on a rebalance would stall the group during an
        # LLM outage; their items are redone by the new owner instead (same call_ids).
        stream_wait_empty=False,
        web_enabled=False,
        topic_partitions=settings.partitions,
        topic_allow_declare=False,
        # An agent that crashed cannot be resumed in place: its unfinished records would
        # never be redelivered. Crash the worker instead; the group redelivers from the
        # last commit and the process supervisor (Kubernetes, compose) restarts it.
        agent_supervisor=mode.CrashingSupervisor,
        broker_credentials=faust_credentials(bootstrap),
    )
    llm = LLM(
        base_url=llm_url,
        api_key=resolve_api_key(settings, spec),
        model=spec.model.name,
        timeout_s=settings.llm_timeout_s or spec.model.timeout_s,
        temperature=spec.model.temperature,
        max_output_tokens=spec.model.max_output_tokens,
    )
    pipeline = Pipeline(settings, spec, llm, Publisher(bootstrap))
    if context is not None:
        messages, ends = context
        pipeline.reconfigure(*apply_context(spec, messages))
        pipeline.follower = ContextFollower(
            bootstrap, settings.topics.context, spec, messages, ends, pipeline.reconfigure
        )
    source_topic = app.topic(topics.input, key_type=bytes, value_type=bytes)
    # Instance state: a changelog-backed table, co-partitioned with the input topic.
    table = app.Table(
        "state", default=None, partitions=settings.partitions, key_type=bytes, value_type=bytes
    )
    if pipeline.solver.prompt.stateful:
        # Without a plan or awaited calls there is no state to keep: writing every item
        # to the changelog would cost a publish per item for nothing.
        pipeline.workflow = Workflow(spec, TableStore(table), settings.pending_timeout_s)
    results_topic = app.topic(topics.results, key_type=bytes, value_type=bytes)
    approvals_topic = app.topic(topics.approvals, key_type=bytes, value_type=bytes)

    async def follow(stream: Any, handle: Any) -> None:
        async for event in stream.noack().events():
            msg = event.message
            entry = pipeline.ledger.track((msg.topic, msg.partition), msg.offset, event.ack)
            await handle(msg.value, entry)

    @app.agent(results_topic, concurrency=1)
    async def results(stream: Any) -> None:
        await follow(stream, pipeline.on_result)

    @app.agent(approvals_topic, concurrency=1)
    async def approvals(stream: Any) -> None:
        await follow(stream, pipeline.on_approval)

    @app.timer(1.0)  # type: ignore[untyped-decorator]
    async def expire() -> None:
        await pipeline.expire()

    @app.timer(5.0)  # type: ignore[untyped-decorator]
    async def lag() -> None:
        for tp in app.consumer.assignment():
            if tp.topic == topics.input:
                high = app.consumer.highwater(tp) or 0
                done = pipeline.ledger.commit_point((tp.topic, tp.partition))
                pipeline.metrics.lag.labels(str(tp.partition)).set(
                    max(0, high - (done if done is not None else high))
                )

    pipeline.web = WebServer(
        pipeline.metrics,
        lambda: pipeline.started and not app.rebalancing,
        settings.web_host,
        settings.web_port,
    )

    @app.agent(source_topic, concurrency=1)
    async def process(stream: Any) -> None:
        _cap_commits(app, pipeline.ledger, {topics.input, topics.results, topics.approvals})
        await pipeline.start()
        try:
            async for event in stream.noack().events():
                msg = event.message
                source = SourcePosition(
                    topic=msg.topic,
                    partition=msg.partition,
                    offset=msg.offset,
                    key=msg.key.decode("utf-8", "replace") if msg.key is not None else None,
                    timestamp_ms=int(msg.timestamp * 1000) if msg.timestamp else None,
                )
                await pipeline.offer(msg.value, msg.key, source, event.ack)
        finally:
            await pipeline.stop()

    async def on_revoked(sender: Any, *args: Any, **kwargs: Any) -> None:
        revoked = args[0] if args else kwargs.get("revoked", set())
        dropped = pipeline.ledger.drop((tp.topic, tp.partition) for tp in revoked)
        if dropped:
            log.info(
                "rebalance: %d unfinished records of revoked partitions left to their next owner",
                dropped,
            )

    @app.timer(30.0)  # type: ignore[untyped-decorator]
    async def report() -> None:
        # A periodic one-line summary until the metrics endpoint lands.
        log.info(
            "stats %s open=%d in_flight=%d",
            orjson.dumps(dict(pipeline.stats)).decode(),
            pipeline.ledger.open_count(),
            len(pipeline._tasks),
        )

    async def on_assigned(sender: Any, *args: Any, **kwargs: Any) -> None:
        assigned = args[0] if args else kwargs.get("assigned", set())
        back = pipeline.ledger.rewinds((tp.topic, tp.partition) for tp in assigned)
        for tp in assigned:
            offset = back.get((tp.topic, tp.partition))
            if offset is not None:
                log.info("rebalance: re-reading %s/%d from %d", tp.topic, tp.partition, offset)
                await app.consumer.seek(tp, offset)

    app.on_partitions_revoked.connect(on_revoked)  # type: ignore[arg-type]
    app.on_partitions_assigned.connect(on_assigned)  # type: ignore[arg-type]
    pipeline.on_fatal = app.crash
    app.pipeline = pipeline  # type: ignore[attr-defined]
    return app
