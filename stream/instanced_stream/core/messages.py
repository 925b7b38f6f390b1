"""Wire contracts: every record the product writes, and the call the model writes.

These pydantic models are the source of truth; `stream schemas` renders them (and the
spec) into schemas/*.json, and a test fails when the two drift apart.
"""

from __future__ import annotations

from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "ITEM_CODES",
    "ActivityRecord",
    "AdviceRecord",
    "ApprovalRecord",
    "BatchRef",
    "Call",
    "DeadLetter",
    "DeadLetterCode",
    "DoneRecord",
    "NoActionRecord",
    "OpinionRecord",
    "ProposalRecord",
    "ResultRecord",
    "SourcePosition",
    "StateUpdateRecord",
    "TraceEntry",
]


class _Record(BaseModel):
    model_config = ConfigDict(populate_by_name=True, frozen=True)


class SourcePosition(_Record):
    """Where an item came from: its identity for auditing and for `call_id`."""

    topic: str
    partition: int
    offset: int
    key: str | None = None
    timestamp_ms: int | None = Field(None, description="Producer timestamp of the item")


class Call(BaseModel):
    """One call as the protocol defines it: meta properties start with `_`, the rest are
    the tool's arguments. On activity topics `_instance` is the producer's id."""

    # Aliases only: a tool argument named "tool" or "instance" must stay an argument.
    model_config = ConfigDict(extra="allow", frozen=True)

    tool: str = Field(alias="_tool")
    instance: str = Field(alias="_instance")
    output_path: str | None = Field(None, alias="_outputPath")
    reasoning: str | None = Field(None, alias="_reasoningForCall")
    scopes: list[str] | None = Field(None, alias="_scopes")

    @property
    def arguments(self) -> dict[str, Any]:
        return dict(self.model_extra or {})

    def wire(self) -> dict[str, Any]:
        """The call as the protocol writes it (aliases, no empty meta properties)."""
        return self.model_dump(by_alias=True, exclude_none=True)


class TraceEntry(_Record):
    """One turn of an instance: follow an item from input to done."""

    turn: int
    batch_id: str
    call_ids: list[str] = Field(default_factory=list)
    note: str | None = None


class BatchRef(_Record):
    id: str = Field(description="Batch id, unique per processor run")
    size: int = Field(description="Instances in the request that produced this record")
    token: str = Field(description="The batch-local token the model saw for this instance")
    attempt: int = Field(description="1 for the first ask; more for re-asks and splits")


class ActivityRecord(_Record):
    """Published to the tool's activity topic, keyed by the producer's instance id."""

    call_id: str = Field(description="Deterministic: source topic/partition/offset/tool/ordinal")
    tool: str
    instance: str = Field(description="The producer's instance id")
    call: Call
    context: list[dict[str, Any]] = Field(
        default_factory=list, description="Messages the call imports through its scopes"
    )
    source: SourcePosition
    batch: BatchRef
    model: str
    advice: dict[str, Any] | None = Field(
        None, description="The council's consensus and votes for this instance, if advised"
    )
    review: str | None = Field(
        None, description="On the review topic: why the advice gate held this call back"
    )
    turn: int = Field(1, description="The instance's turn that made this call")
    latent: list[dict[str, Any]] = Field(
        default_factory=list,
        description="A spec without a plan: the latent calls with `_outputPath` the model "
        "answered for this instance in the same answer; their output is part of the "
        "instance's outcome, here (and on the no-action record when it made no activity call)",
    )
    trace: list[TraceEntry] = Field(
        default_factory=list, description="The instance's turns so far (stateful runs)"
    )


class ResultRecord(_Record):
    """An activity's answer to an awaited call (one with `_outputPath`), on the results
    topic, keyed by instance id."""

    call_id: str = Field(description="The awaited call this result answers")
    instance: str
    tool: str
    turn: int = Field(
        description="The instance's turn that made the call (the activity record's `turn`): "
        "a result for a call that is not pending at that turn is refused"
    )
    value: Any = None
    path: str | None = Field(
        None, description="The alternative the activity chose, for a branching output path"
    )
    error: str | None = None
    source: SourcePosition | None = None


class DoneRecord(_Record):
    """An instance's final state, on the done topic, when its workflow ends."""

    instance: str
    status: Literal["done", "turn_limit", "stopped", "rejected"]
    reason: str | None = None
    turns: int
    state: dict[str, Any]
    trace: list[TraceEntry]
    source: SourcePosition | None = None


class ProposalRecord(_Record):
    """Lazy plans: the calls the model proposes; nothing runs until approved."""

    instance: str
    proposal_id: str = Field(
        description="Deterministic per input and turn; an approval names it to answer it"
    )
    turn: int
    batch: BatchRef
    calls: list[dict[str, Any]]
    call_ids: list[str]
    plan: list[dict[str, Any]] = Field(
        default_factory=list,
        description="The model's plan: its steps (tool, _outputPath, the †state inputs "
        "they read), in the order they run; a step waits for the earlier ones it reads",
    )
    goal: str | None = Field(None, description="The spec plan's goal")
    source: SourcePosition | None = None
    history: list[dict[str, Any]] = Field(
        default_factory=list,
        description="The rejected versions before this one (plan.maxRevisions): each "
        "proposal_id, turn, steps and the reason it was rejected",
    )


class ApprovalRecord(_Record):
    """A person's answer to one proposal, keyed by instance id. It names the proposal
    (id and turn) it answers: one that names anything but the proposal pending now (an
    older one, a replay, a guess) is refused with a dead letter, never applied."""

    instance: str
    proposal_id: str = Field(description="The `proposal_id` of the proposal it answers")
    turn: int = Field(description="The `turn` of the proposal it answers")
    approve: bool
    reason: str | None = None


class OpinionRecord(_Record):
    advisor: str
    weight: float
    instanced: bool = Field(description="false: one opinion for the whole request")
    fields: dict[str, Any] = Field(description="The opinion's own fields (its schema's)")
    votes: dict[str, float] | None = Field(
        None,
        description="Confidence per option, 0-1 (the model's 0-100 score / 100); "
        "independent scores, not shares: they need not sum to 1",
    )
    votes_raw: Any = Field(None, description="The inline JSON as the model wrote it")
    error: str | None = Field(None, description="Why the votes or fields were not usable")


class AdviceRecord(_Record):
    """Published to the advice topic, keyed by instance id: one per instance and turn."""

    instance: str
    turn: int = 1
    source: SourcePosition
    batch: BatchRef
    opinions: list[OpinionRecord]
    consensus: dict[str, Any] = Field(
        description="option, score, divergence, distribution, advisors"
    )
    divergent: bool = Field(description="divergence at or above the spec's alert level")
    consulted: list[str] = Field(default_factory=list)
    questions: list[dict[str, str]] = Field(
        default_factory=list,
        description="What the model asked the consulted advisors: advisor and question",
    )
    call_ids: list[str] = Field(default_factory=list)
    reviewed: list[str] = Field(
        default_factory=list, description="call_ids the gate sent to the review topic"
    )


class NoActionRecord(_Record):
    """The model decided explicitly that an instance needs no call: recorded, not lost."""

    instance: str
    reason: str
    source: SourcePosition
    batch: BatchRef
    turn: int = Field(1, description="The instance's turn that decided it needs no call")
    latent: list[dict[str, Any]] = Field(
        default_factory=list,
        description="The latent calls the model answered for it, with their outputs: in a "
        "spec without a plan (one-shot, stateless) a latent call's `_outputPath` output is "
        "part of the instance's outcome, here",
    )


class StateUpdateRecord(_Record):
    """Without a plan (one-shot, stateless: nothing is kept), the model's update of an
    instance's state, when its answer holds only latent calls writing `†state`: the
    instance's outcome, keyed by its id. The processor keeps none of it; a consumer that
    keeps the state applies it."""

    instance: str
    source: SourcePosition
    batch: BatchRef
    turn: int = Field(1, description="The instance's turn that decided it")
    updates: list[dict[str, Any]] = Field(
        description="The latent calls the model answered, each with its `_outputPath` (a "
        "`†state` path) and its output (the call's arguments), in the answer's order"
    )


# the item itself ends here
ItemCode = Literal[
    "not_json",
    # Schema Registry wire format: the schema id is unknown (or no registry is configured,
    # or the schema's type is not decoded), or the payload does not decode with its schema
    "unknown_schema",
    "undecodable",
    "not_object",
    "no_instance",
    "too_large",
    "unanswered",
    "llm_rejected",
    "llm_timeout",
    "llm_error",
    "internal_error",
    # a `type: state` record on the input topic, and the spec does not accept state input
    "state_input_refused",
    # a tool, advisor, plan or global input sent to the input topic, where the spec does
    # not forward context messages (accept_context_input): its reason names the topic
    "context_on_input",
]
DeadLetterCode = Literal[
    ItemCode,
    # one call of the model's answer was refused; its item is asked again
    "unknown_tool",
    "unknown_instance",
    "bad_arguments",
    "malformed_call",
    "duplicate_call",
    "bad_output_path",
    "bad_scopes",
    # one instance's calls make no graph that can run: a cycle, or a step reading a path
    # that no call writes and the state lacks; the instance is asked again
    "bad_plan",
    # a lazy plan's planning turn answered a latent step (nothing latent runs before
    # approval); the instance's whole plan is asked again
    "latent_in_lazy_plan",
    # a call's arguments copied another instance's input text (an injection obeyed)
    "cross_instance",
    # an activity handler kept failing on a published call
    "activity_failed",
    # an awaited call's result broke its tool's `_output` schema, or cannot be written
    "bad_result",
    # a result or an approval that answers nothing pending (wrong call, turn or proposal)
    "unexpected_result",
    "unexpected_approval",
    # a result or an approval written to another partition than its instance's input's
    "wrong_partition",
    # a lazy plan's follow-up call that the approved graph does not hold: not run (a
    # changed graph would need a new approval)
    "outside_plan",
    # a call of the answer in which a finish advisor voted stop: the workflow ended and
    # the call was not run
    "stopped",
    # a state changelog record the store cannot read: quarantined, its key deleted, so
    # the partition opens without it (the instance's next input starts afresh)
    "unreadable_state",
]

ITEM_CODES: frozenset[str] = frozenset(get_args(ItemCode))


class DeadLetter(_Record):
    code: DeadLetterCode
    reason: str = Field(description="Human-readable cause")
    scope: Literal["item", "call"] = Field(
        description="item: the input item ends here; call: one refused call of an answer"
    )
    instance: str | None = None
    source: SourcePosition | None = None
    raw_b64: str | None = Field(
        None, description="The input record's value, base64 (its first 64 KiB)"
    )
    raw_size: int | None = Field(None, description="Size of the input record's value in bytes")
    call: dict[str, Any] | None = Field(None, description="The refused call, as the model wrote it")
    attempts: int = 0
    batch_id: str | None = None
    turn: int = Field(1, description="The instance's turn whose answer was refused or failed")
