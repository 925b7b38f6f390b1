"""Twins: items of the same content (core/dedupe.py) asked once.

Within a window the first of its twins is asked and its answer is given to the others;
across windows a bounded answer cache, keyed by the content and the spec's fingerprint
(instructions, tools, global inputs, model and answer form), answers later twins for
`dedupe.cache_ttl_s`. A batch's answers are keyed by the edition of the spec it asked on
(`Edition`, core/live_spec.py): a change of spec is a new cache. Each twin keeps its own
instance, so the records built from its answer carry its own id, source and call_ids
(runtime/pipeline/outcomes/records.py): what is shared is only what the model was asked. A
content a batch in flight is asking is not asked by another: that batch's twins wait for
the answer (and ask it themselves if none came).

Twins asks nothing itself; the batch's owner (`Dispatch._once`, runtime/pipeline/dispatch.py)
drives one window through it with plain values: `Twins.split` (what to ask), the ask,
`Twins.settle` (the answers to the other batches and the cache), `Twins.waited` (the
contents other batches asked), `Twins.expand` (the outcome of the whole window).
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import orjson

from instanced_stream.core.dedupe import content_key
from instanced_stream.core.instance import Instance
from instanced_stream.core.live_spec import Edition, LiveSpec
from instanced_stream.core.solve import Answer, Outcome, Unanswered
from instanced_stream.core.spec import AgentSpec

__all__ = ["AnswerCache", "Split", "Twins", "fingerprint", "merge"]


def fingerprint(spec: AgentSpec, system: str) -> str:
    """What an answer depends on besides the item: a change of any of it is a new cache."""
    model = spec.model
    said = {
        "system": system,  # the instructions, tools and answer form as the prompt says them
        "inputs": [m.model_dump(mode="json") for m in spec.inputs],
        "model": [model.name, model.answer, model.reasoning, model.temperature],
        "ids": spec.instance_ids,
    }
    return hashlib.sha256(orjson.dumps(said, option=orjson.OPT_SORT_KEYS)).hexdigest()[:16]


class AnswerCache:
    """Answers by key for `ttl_s`, at most `size` of them (the least recently used go)."""

    def __init__(self, ttl_s: float, size: int, clock: Callable[[], float] = time.monotonic):
        self.ttl_s = ttl_s
        self.size = size
        self.clock = clock
        self._answers: OrderedDict[str, tuple[float, Answer]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._answers)

    def get(self, key: str) -> Answer | None:
        found = self._answers.get(key)
        if found is None:
            return None
        if self.clock() - found[0] >= self.ttl_s:
            del self._answers[key]
            return None
        self._answers.move_to_end(key)
        return found[1]

    def put(self, key: str, answer: Answer) -> None:
        if self.ttl_s <= 0:
            return
        self._answers[key] = (self.clock(), answer)
        self._answers.move_to_end(key)
        while len(self._answers) > self.size:
            self._answers.popitem(last=False)

    def clear(self) -> None:
        self._answers.clear()


@dataclass(slots=True)
class Split:
    """A window, split: whom to ask, who stands for whom, who the cache answered."""

    asked: list[Instance]
    twins: dict[int, list[Instance]] = field(default_factory=dict)  # id(asked) -> its twins
    keys: dict[int, str] = field(default_factory=dict)  # id(asked) -> its cache key
    reused: list[Answer] = field(default_factory=list)
    # Twins of contents another batch is asking now, and that answer's future.
    waiting: list[tuple[Instance, asyncio.Future[Answer | None]]] = field(default_factory=list)
    flying: dict[int, asyncio.Future[Answer | None]] = field(default_factory=dict)  # id(asked)

    @property
    def spared(self) -> int:
        """Instances not asked here: twins in the window, in flight and in the cache."""
        return sum(len(t) for t in self.twins.values()) + len(self.reused)


def merge(into: Outcome, more: Outcome) -> Outcome:
    """`more` (a second ask in the same batch) added to `into`."""
    into.answers += more.answers
    into.unanswered += more.unanswered
    into.refusals += more.refusals
    into.latencies += more.latencies
    into.notes.update(more.notes)
    for name in ("requests", "prompt_tokens", "completion_tokens", "cached_tokens"):
        setattr(into, name, getattr(into, name) + getattr(more, name))
    into.reasoning_tokens += more.reasoning_tokens
    into.consults += more.consults
    into.stray_opinions += more.stray_opinions
    return into


@dataclass(frozen=True, slots=True)
class _Keys:
    """How a content's cache key is made under one edition of the spec."""

    version: int  # the edition's
    enabled: bool
    ids_shown: bool
    fingerprint: str

    @classmethod
    def of(cls, edition: Edition) -> _Keys:
        spec, dedupe = edition.spec, edition.spec.dedupe
        enabled = dedupe.enabled and (spec.plan is None or dedupe.stateful)
        ids_shown = spec.instance_ids == "shown"
        return cls(edition.version, enabled, ids_shown, fingerprint(spec, edition.system))

    def key(self, inst: Instance) -> str:
        return f"{self.fingerprint}/{content_key(inst, self.ids_shown)}"


class Twins:
    def __init__(self, live: LiveSpec, clock: Callable[[], float] = time.monotonic) -> None:
        self.live = live  # the spec, read at each use
        dedupe = live.spec.dedupe
        self.cache = AnswerCache(dedupe.cache_ttl_s, dedupe.cache_items, clock)
        # Contents asked by a batch in flight: a twin in another window waits for it.
        self._flying: dict[str, asyncio.Future[Answer | None]] = {}
        self._open: set[str] = set()  # contents in the open window (`free`)
        self._keys = _Keys.of(live.edition)  # made again when the edition asked about changes
        self._bounded = live.version  # the edition the cache's bounds are of

    def _keys_of(self, edition: Edition) -> _Keys:
        """The keys under `edition`: a change of spec is a new fingerprint, so a new cache;
        the cache's bounds follow the newest edition seen."""
        if self._keys.version != edition.version:
            self._keys = _Keys.of(edition)
        if edition.version > self._bounded:
            dedupe = edition.spec.dedupe
            self.cache.ttl_s, self.cache.size = dedupe.cache_ttl_s, dedupe.cache_items
            self._bounded = edition.version
        return self._keys

    async def waited(self, split: Split) -> list[Instance]:
        """Waits for the answers of the contents other batches in flight are asking
        (`split.waiting`), each given to its twin here; returns the twins whose batch ended
        without an answer: the caller asks them itself."""
        alone: list[Instance] = []
        for inst, flying in split.waiting:
            answer = await flying
            if answer is None:
                alone.append(inst)
            else:
                split.reused.append(replace(answer, instance=inst))
        return alone

    def settle(self, split: Split, outcome: Outcome | None) -> None:
        """Tells the twins waiting in other batches what their content's answer is (None: the
        ask failed, they ask it themselves), and
        caches it in the same step: a content must never be neither in flight nor cached
        while it has an answer, or a batch split in between would ask it again."""
        answers = {id(a.instance): a for a in outcome.answers} if outcome else {}
        for ident, flying in split.flying.items():
            if flying.done():
                continue
            answer, key = answers.get(ident), split.keys[ident]
            flying.set_result(answer)
            if answer is not None:
                self.cache.put(key, answer)
            if self._flying.get(key) is flying:
                del self._flying[key]

    def free(self, inst: Instance) -> bool:
        """Whether `inst` will not be asked (the windower gives it no place): its content
        is in the open window, asked by a batch in flight or cached. Else the content
        joins the open window's, until `closed`."""
        keys = self._keys_of(self.live.edition)
        if not keys.enabled:
            return False
        key = keys.key(inst)
        if key in self._open or key in self._flying or self.cache.get(key) is not None:
            return True
        self._open.add(key)
        return False

    def closed(self) -> None:
        """The open window closed: its contents are the batch's now."""
        self._open.clear()

    def split(self, instances: list[Instance], edition: Edition | None = None) -> Split:
        """Whom of `instances` to ask, the batch asking on `edition` of the spec (the one
        its answers are cached under; the live one unless given)."""
        keys = self._keys_of(self.live.edition if edition is None else edition)
        if not keys.enabled:
            return Split(list(instances))
        out = Split([])
        first: dict[str, Instance] = {}
        for inst in instances:
            key = keys.key(inst)
            stand = first.get(key)
            if stand is not None:
                out.twins[id(stand)].append(inst)
                continue
            cached = self.cache.get(key)
            if cached is not None:
                out.reused.append(replace(cached, instance=inst))
                continue
            if key in self._flying:
                out.waiting.append((inst, self._flying[key]))
                continue
            first[key] = inst
            out.asked.append(inst)
            out.twins[id(inst)] = []
            out.keys[id(inst)] = key
            if (loop := self._loop()) is not None:
                out.flying[id(inst)] = self._flying[key] = loop.create_future()
        return out

    @staticmethod
    def _loop() -> asyncio.AbstractEventLoop | None:
        try:
            return asyncio.get_running_loop()
        except RuntimeError:  # the pure use (tests): no batches in flight to share with
            return None

    def expand(self, outcome: Outcome, split: Split) -> Outcome:
        """`outcome` of the asked, for the whole window: each twin gets what the one that
        stood for it got (its answer, or its dead letter's reason); answers are cached."""
        if not split.keys and not split.reused:
            return outcome  # nothing shared: dedupe is off, or the window was empty
        settled: set[int] = set()
        for answer in list(outcome.answers):
            stand = id(answer.instance)
            settled.add(stand)
            if stand in split.keys:
                self.cache.put(split.keys[stand], answer)
            outcome.answers += [replace(answer, instance=t) for t in split.twins.get(stand, ())]
        for miss in list(outcome.unanswered):
            settled.add(id(miss.instance))
            outcome.unanswered += [
                replace(miss, instance=t) for t in split.twins.get(id(miss.instance), ())
            ]
        for inst in split.asked:  # the solver ends every instance; this is a safety net
            if id(inst) not in settled:
                why = "its twin, asked for it, ended without an answer"
                outcome.unanswered += [
                    Unanswered(t, "unanswered", why, 0) for t in split.twins.get(id(inst), ())
                ]
        outcome.answers += split.reused
        outcome.spared = split.spared
        return outcome
