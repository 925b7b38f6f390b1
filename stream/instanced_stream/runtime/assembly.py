"""The composition root: the processor's pieces built from the settings, the spec and the
clients, and connected, in one place.

`assemble` builds everything `stream process` runs (runtime/service.py runs it: the fetch
loop, the routing of results and approvals, the timers, readiness). Its pipeline part,
`assemble_pipeline` (the record builder, the workflows and their stores, the stager), is
also what the test rig builds (tests/flows.py), given its own model and stores, so the
tests run the wiring the product runs. Nothing here starts, fetches or sends: building a
piece opens no connection.

What travels together is built here once, as a frozen value, and handed on whole: the
pipeline's `ModelAccess` and `Hosting` (runtime/pipeline/stager.py), through
`assemble_pipeline` to the stager; the membership's `GroupAddress`, `MemberBounds` and
`MemberHooks` (runtime/units/membership.py).
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from instanced_stream.core.instance import Instance
from instanced_stream.core.live_spec import LiveSpec
from instanced_stream.core.overrides import Messages, apply_overrides
from instanced_stream.core.spec import AgentSpec
from instanced_stream.core.workflow import Workflow
from instanced_stream.faultpoints import Probe
from instanced_stream.kafka.topics import answer_journal, batch_changelog, state_changelog
from instanced_stream.llm.batch_api import BatchModel
from instanced_stream.llm.client import LLM
from instanced_stream.llm.factory import build_llm
from instanced_stream.llm.limiter import Limiter
from instanced_stream.observe.metrics import Metrics
from instanced_stream.observe.web import WebServer
from instanced_stream.runtime.batch_api.ledger import Ledger
from instanced_stream.runtime.batch_api.submissions import Submissions
from instanced_stream.runtime.pipeline.answers import Answers
from instanced_stream.runtime.pipeline.idea_view import IdeaView
from instanced_stream.runtime.pipeline.journal import AnswerJournal
from instanced_stream.runtime.pipeline.outcomes.records import RecordBuilder
from instanced_stream.runtime.pipeline.overrides import OverrideFollower
from instanced_stream.runtime.pipeline.replies import Replies
from instanced_stream.runtime.pipeline.restore import Restores
from instanced_stream.runtime.pipeline.stager import Hosting, ModelAccess, Stager
from instanced_stream.runtime.pipeline.tier import ONLINE
from instanced_stream.runtime.pipeline.workflows import Flows
from instanced_stream.runtime.state.recall import Recall
from instanced_stream.runtime.state.store import Stores
from instanced_stream.runtime.units.lanes import Lanes
from instanced_stream.runtime.units.membership import (
    GroupAddress,
    MemberBounds,
    MemberHooks,
    Membership,
)
from instanced_stream.runtime.units.producers import Producers
from instanced_stream.runtime.units.unit import Unit, uncommitted
from instanced_stream.settings import Settings

__all__ = [
    "Pipeline",
    "Processor",
    "Routes",
    "assemble",
    "assemble_pipeline",
    "limiter_for",
    "metrics_for",
]

log = logging.getLogger("stream.processor")


def metrics_for(spec: AgentSpec) -> Metrics:
    """The processor's metrics: the model's prices, the window's agreement."""
    return Metrics(spec.model, spec.window.max_items)


def limiter_for(spec: AgentSpec, metrics: Metrics) -> Limiter:
    """The in-flight limiter the spec asks for, reporting its limit to the metrics."""
    return Limiter(
        spec.window.max_in_flight, adaptive=spec.window.adaptive, on_change=metrics.on_limit
    )


@dataclass(frozen=True)
class Pipeline:
    """What consumed records go through to become staged outcomes: the live spec (its one
    holder: every piece reads it there, and a change is installed there alone,
    `LiveSpec.install`), the builder of their records, the workflows (None for a spec
    without a plan: nothing of an instance outlives its request) and the stager."""

    live: LiveSpec
    builder: RecordBuilder
    flows: Flows | None
    answers: Answers | None  # results and approvals into the workflows (with `flows`)
    stager: Stager


def assemble_pipeline(
    settings: Settings,
    spec: AgentSpec,
    access: ModelAccess,
    hosting: Hosting,
    *,
    stores: Callable[[], Stores],
) -> Pipeline:
    """The pipeline on the model `access` reaches, in the process `hosting` describes
    (both handed to the stager whole), its state in the stores `stores` makes (asked only
    for a spec with a plan)."""
    metrics, worker = hosting.metrics, hosting.worker
    live = LiveSpec(spec)
    builder = RecordBuilder(live, settings.topics, access.llm.model)
    flows = None
    # The seeds: no Plan message, one-shot and stateless. A plan-less spec gets no
    # store, no changelog and no workflow: nothing of an instance outlives its request.
    if spec.plan is not None:
        held = stores()
        workflow = Workflow(
            live, held, settings.pending_timeout_s, settings.state_retention_s, worker
        )
        flows = Flows(
            workflow,
            held,
            builder,
            metrics,
            worker,
            state_changelog(settings),
            settings.max_output_bytes,
        )
    stager = Stager(settings, live, access, hosting, builder=builder, flows=flows)
    answers = Answers(flows) if flows is not None else None
    return Pipeline(live, builder, flows, answers, stager)


class Routes(Protocol):
    """What the service does with what the group and the context topic hand it
    (runtime/service.py): the pieces built here call these, the service answers."""

    def unit_of(self, partition: int) -> Unit | None:
        """The open unit of `partition` on this member, if any."""
        ...

    async def opened(self, unit: Unit) -> None:
        """A unit opened: its store restored, its submitted lines found."""
        ...

    def closed(self, unit: Unit) -> None:
        """A unit closed: what this member kept of its partition let go."""
        ...

    def ready(self, unit: Unit, ready: list[Instance]) -> None:
        """The next turns of these instances are ready at `unit` (results, approvals and
        restores make them): offered to the windows."""
        ...

    def reconfigure(self, spec: AgentSpec, refused: list[tuple[str, str]]) -> None:
        """The context topic changed the spec (`refused`: its messages left out, why)."""
        ...

    def ready_now(self) -> bool:
        """Whether the member serves every partition it was given (the readiness probe)."""
        ...


@dataclass(frozen=True)
class Processor:
    """Everything `stream process` runs, built and connected, not started."""

    metrics: Metrics
    worker: str  # this process's name: in its client id and its batches' ids
    pipeline: Pipeline
    llm: LLM | BatchModel
    second: LLM | None  # model.escalate's client
    submissions: Submissions | None  # the Batch API tier's record of what it submitted
    journal: AnswerJournal | None  # the answers not committed yet (STREAM_ANSWER_JOURNAL)
    restores: Restores | None  # a stateful spec's restores of its units' stores
    lanes: Lanes
    membership: Membership
    follower: OverrideFollower
    web: WebServer
    ideas: IdeaView | None = None  # a plan's Idea Process, followed for the live page


def assemble(
    settings: Settings,
    spec: AgentSpec,
    bootstrap: str,
    llm_url: str,
    overrides: tuple[Messages, dict[int, int]],
    probe: Probe,
    routes: Routes,
) -> Processor:
    """The processor for `spec` on the broker at `bootstrap` and the endpoint at `llm_url`,
    the context topic's messages read so far (`overrides`: the messages, the offsets they
    end at) applied to the spec."""
    topics = settings.topics
    metrics = metrics_for(spec)
    limiter, llm, submissions = _tiered(settings, spec, metrics, llm_url, routes.unit_of)
    messages, ends = overrides
    merged, refused = apply_overrides(spec, messages)
    for key, reason in refused:
        log.error("context message %s refused: %s", key, reason)
    metrics.context_refused.set(len(refused))
    worker = secrets.token_hex(3)
    second = _second(settings, merged, metrics, llm_url)
    journal = (
        AnswerJournal(bootstrap, answer_journal(settings), metrics)
        if settings.answer_journal
        else None
    )
    parts = assemble_pipeline(
        settings,
        merged,
        ModelAccess(llm, limiter, second=second, tier=submissions or ONLINE, journal=journal),
        Hosting(worker, metrics, probe=probe, ready=routes.ready),
        stores=lambda: Stores(Recall(bootstrap, state_changelog(settings))),
    )
    restores = Restores(parts.flows, bootstrap) if parts.flows is not None else None
    stager = parts.stager
    # Results and approvals: routed by their own room, each applied by its partition's lane.
    replies = Replies(
        stager.staging,
        parts.answers,
        routes.ready,
        results=topics.results,
        partitions=settings.partitions,
        probe=probe,
    )
    lanes = Lanes(replies.take)
    group = settings.topic_prefix + settings.app_id
    address = GroupAddress(
        bootstrap,
        group,
        [topics.input, topics.results, topics.approvals],
        client_id=f"{group}-{socket.gethostname()}-{os.getpid()}-{worker}",
        group_instance_id=settings.group_instance_id,
    )
    bounds = MemberBounds(
        settings.session_timeout_s,
        # A revocation waits for the batches in flight (runtime/units/rebalance.py): up
        # to the drain's budget, what a stop gives them, and never past half the session
        # timeout. The group waits for a member to rejoin up to its rebalance timeout
        # (aiokafka's: the session timeout), counted from the rebalance's start, which
        # the member hears of at its next heartbeat (a fifth of the session): half leaves
        # room for that and the commit. Not a longer rebalance timeout: the broker waits
        # that long for a member that asked to join and died, so every member killed in
        # its join would hold the whole group longer.
        landing_s=min(settings.drain_s, settings.session_timeout_s / 2),
    )
    hooks = MemberHooks(
        on_open=routes.opened if parts.flows or submissions or journal else None,
        on_close=routes.closed,
        on_rebalance=metrics.rebalances.inc,
        # The spend ceiling is the group's: each member keeps its partitions' share.
        on_assigned=lambda n: stager.dispatch.spend.owns(n, settings.partitions),
        on_failed=lambda p, _exc: metrics.partitions.failed(p),
        restore_progress=restores.progress if restores else lambda _p: 0,
        landed=stager.landed,
    )
    producers = _producers(settings, bootstrap, group, stager, probe)
    membership = Membership(address, producers, bounds, hooks, probe=probe)
    follower = OverrideFollower(bootstrap, topics.context, spec, messages, ends, routes.reconfigure)
    # Ready: in a stable generation of the group and serving every partition it was
    # given (what a rollout and a disruption budget need to know): a unit restoring or
    # failing to open is not served yet, and a group rebalancing more than a few
    # times a minute serves nothing for long. The model's state is only reported.
    # A spec with a plan: its Idea Process topic, followed for the page (counts only).
    ideas = IdeaView(bootstrap, topics.ideas) if spec.plan is not None else None
    web = WebServer(
        metrics,
        routes.ready_now,
        settings.web_host,
        settings.web_port,
        model_ok=lambda: metrics.endpoint_ok,
        partitions=membership.states,
        units=lambda: uncommitted(membership.units),
        group=membership.group,
        ideas=ideas.plans if ideas is not None else None,
    )
    return Processor(
        metrics,
        worker,
        parts,
        llm,
        second,
        submissions,
        journal,
        restores,
        lanes,
        membership,
        follower,
        web,
        ideas,
    )


def _producers(
    settings: Settings, bootstrap: str, group: str, stager: Stager, probe: Probe
) -> Producers:
    """The units' producers: transactional per input partition (exactly once), or one
    shared idempotent producer."""
    return Producers(
        bootstrap,
        group,
        transactional=settings.delivery == "exactly_once",
        transactional_prefix=f"{group}.{settings.topics.input}",
        request_timeout_ms=settings.publish_timeout_ms,
        replace=stager.staging.replacement,
        probe=probe,
        commit_interval_s=settings.commit_interval,
    )


def _tiered(
    settings: Settings,
    spec: AgentSpec,
    metrics: Metrics,
    llm_url: str,
    units: Callable[[int], Unit | None],
) -> tuple[Limiter, LLM | BatchModel, Submissions | None]:
    """The in-flight limiter, the model and (batch tier) the record of what it submitted."""
    if spec.model.tier == "online":
        limiter = limiter_for(spec, metrics)
        online = build_llm(settings, spec, listener=metrics, limiter=limiter, base_url=llm_url)
        return limiter, online, None
    # Windows wait for their batch (minutes to hours), not for a slot of the endpoint:
    # room for a batch being submitted and the next one filling.
    limiter = Limiter(2 * spec.batch.max_requests, adaptive=False, on_change=metrics.on_limit)
    online = build_llm(settings, spec, listener=metrics, limiter=limiter, base_url=llm_url)
    model = BatchModel(online, spec.batch, lambda _batch, _lines: None)
    return limiter, model, Submissions(Ledger(batch_changelog(settings)), model, units)


def _second(settings: Settings, spec: AgentSpec, metrics: Metrics, llm_url: str) -> LLM | None:
    """model.escalate's client: its own model name, on its own endpoint or ours."""
    second = spec.model.escalate
    if second is None:
        return None
    model = spec.model.model_copy(update={"name": second.name, "escalate": None})
    return build_llm(
        settings.model_copy(update={"llm_model": None}),
        spec.model_copy(update={"model": model}),
        listener=metrics,
        base_url=second.base_url or llm_url,
    )
