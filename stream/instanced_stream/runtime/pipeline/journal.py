"""The answer journal: each instance's validated answer, kept until its outcome commits,
so that a redo after a crash, a fencing or a rebalance does not pay the model again.

Exactly once (docs/architecture.md) redoes a unit's uncommitted prefix from its last
commit, and the redo used to ask the model again for items whose answer had come back:
the bill paid twice, and a window that brings the processor down after its answer paid at
every restart. Here each answer goes, before it is staged, to the journal topic
(`<app id>-answers-journal`, compacted, co-partitioned with the input) at its input's
partition, keyed by `Instance.key` (`topic/partition/offset/turn`). That write must
outlive a crash before the unit's transaction commits, so it is not part of that
transaction: it goes through a plain idempotent, acks=all producer and is awaited before
staging. The unit's transaction then writes the entry's tombstone with the outcome
(`tombstones`, on the item's own slot): an entry lives exactly as long as the outcome
that used it is uncommitted. A unit opened here reads its journal partition to the end
(`restore`) and a redo of the same source position and turn, under the same spec
(its `fingerprint`: instructions, tools, inputs, model, answer form) and of the same
content (the state a later turn shows), takes the answer from there (`take`) instead of
asking. The journal only saves an ask: what becomes of the item is still written by the
unit's transaction, from the answer, as if it had just come back.

An entry that is never taken (its spec changed before the redo) is dropped with its
partition here, and from the topic by its retention (a week: kafka/topics.py).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from instanced_stream.core.dedupe import content_key
from instanced_stream.core.instance import Instance
from instanced_stream.core.live_spec import Edition
from instanced_stream.core.messages import Call
from instanced_stream.core.solve import Answer
from instanced_stream.core.validate import Opinion
from instanced_stream.kafka import clients
from instanced_stream.kafka.records import OutRecord
from instanced_stream.kafka.topics import read_changelog
from instanced_stream.observe.metrics import Metrics
from instanced_stream.runtime.pipeline.outcomes.records import position
from instanced_stream.runtime.pipeline.windows.twins import fingerprint

__all__ = ["AnswerJournal", "Entry"]

log = logging.getLogger("stream.journal")


class Entry(BaseModel):
    """One journaled answer: what the solver accepted for one instance's turn, and what
    it was asked under (`edition`: the spec's fingerprint; `content`: the item as the
    prompt showed it)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    edition: str
    content: str
    calls: list[dict[str, Any]]
    token: str
    size: int
    attempt: int
    opinions: list[dict[str, Any]] = []
    consulted: list[str] = []
    questions: list[tuple[str, str]] = []
    unheard: list[str] = []

    @classmethod
    def of(cls, answer: Answer, edition: str) -> Entry:
        return cls(
            edition=edition,
            content=content_key(answer.instance, True),
            calls=[c.wire() for c in answer.calls],
            token=answer.token,
            size=answer.size,
            attempt=answer.attempt,
            opinions=[
                {
                    "advisor": o.advisor,
                    "token": o.token,
                    "fields": o.fields,
                    "votes_raw": o.votes_raw,
                    "error": o.error,
                }
                for o in answer.opinions
            ],
            consulted=list(answer.consulted),
            questions=list(answer.questions),
            unheard=list(answer.unheard),
        )

    def answer(self, inst: Instance) -> Answer:
        """The answer again, for `inst` (the redo's own instance)."""
        return Answer(
            inst,
            [Call.model_validate(c) for c in self.calls],
            self.token,
            self.size,
            self.attempt,
            [Opinion(**o) for o in self.opinions],
            list(self.consulted),
            list(self.questions),
            list(self.unheard),
        )


class AnswerJournal:
    """The journal of one processor: its producer, and the entries of the partitions it
    restored, by partition and key, until they are taken."""

    def __init__(self, bootstrap: str, topic: str, metrics: Metrics, producer: Any = None) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self.metrics = metrics
        self.found: dict[int, dict[str, Entry]] = {}
        self.saved = 0  # answers taken from the journal instead of asked
        self._producer: Any = producer  # made by `start` unless given (tests)
        self._editions: tuple[int, str] = (-1, "")

    async def start(self) -> None:
        # Made here: aiokafka binds a client to the loop running when it is made.
        if self._producer is None:
            self._producer = clients.producer(
                self.bootstrap, client_id=clients.client_id("journal")
            )
        await self._producer.start()

    async def stop(self) -> None:
        if self._producer is not None:
            producer, self._producer = self._producer, None
            await producer.stop()

    def edition_of(self, edition: Edition) -> str:
        """The fingerprint an answer is journaled under (made once per edition)."""
        if self._editions[0] != edition.version:
            self._editions = (edition.version, fingerprint(edition.spec, edition.system))
        return self._editions[1]

    async def restore(self, partition: int) -> int:
        """A unit opened here: its partition's entries (read committed, to the end);
        returns how many. An unreadable entry is skipped: its item is asked again."""
        found: dict[str, Entry] = {}
        for key, raw in (await read_changelog(self.bootstrap, self.topic, partition)).items():
            try:
                found[key] = Entry.model_validate_json(raw)
            except ValidationError as exc:
                log.warning("journal entry %s unreadable, its item is asked again: %s", key, exc)
        if found:
            self.found[partition] = found
        else:
            self.found.pop(partition, None)
        return len(found)

    def drop(self, partition: int) -> None:
        """The partition's unit closed here: its entries are its next owner's."""
        self.found.pop(partition, None)

    def take(
        self, instances: list[Instance], edition: Edition
    ) -> tuple[list[Answer], list[Instance]]:
        """(the answers the journal holds for `instances` under `edition`, the instances
        still to ask). An entry of another spec or content is dropped: its redo asks."""
        if not self.found:
            return [], instances
        said = self.edition_of(edition)
        answers: list[Answer] = []
        rest: list[Instance] = []
        for inst in instances:
            entries = self.found.get(inst.source.partition)
            entry = entries.pop(inst.key, None) if entries is not None else None
            if (
                entry is not None
                and entry.edition == said
                and entry.content == content_key(inst, True)
            ):
                answers.append(entry.answer(inst))
                continue
            rest.append(inst)
        if answers:
            self.saved += len(answers)
            self.metrics.count({"answers_reused": len(answers)})
            log.info("%d answers taken from the journal, not asked again", len(answers))
        return answers, rest

    async def write(self, answers: list[Answer], edition: Edition) -> None:
        """Journals `answers`, each at its input's partition; returns once the broker
        has every one (acks=all), so none is staged before its entry is durable."""
        if not answers or self._producer is None:
            return
        said = self.edition_of(edition)
        sent = [
            await self._producer.send(
                self.topic,
                Entry.of(a, said).model_dump_json().encode(),
                key=a.instance.key.encode(),
                partition=a.instance.source.partition,
            )
            for a in answers
        ]
        await asyncio.gather(*sent)

    def tombstones(self, answers: list[Answer]) -> list[OutRecord]:
        """The entries' tombstones, each on its item's slot (`origin`), so it commits in
        the transaction that commits the item's outcome, never before."""
        return [
            OutRecord(
                self.topic,
                a.instance.key.encode(),
                b"",
                position(a.instance.source),
                a.instance.source.partition,
            )
            for a in answers
        ]
