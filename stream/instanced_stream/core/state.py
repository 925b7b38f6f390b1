"""Instance state: what one instance has learned across turns, kept in a changelog-backed
store keyed by the producer's instance id (runtime/state/store.py: a unit's store, restored from
its changelog partition).

The changelog record of an instance goes to the partition its input came from, so the
worker that owns an input partition also owns (and restores) the state of the instances
that arrive on it. Writes are idempotent per trigger: a batch redone after a crash finds
its own trigger recorded and does not apply the same effect twice.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Literal, NamedTuple, Protocol

from pydantic import BaseModel, ConfigDict, Field

from instanced_stream.core.messages import SourcePosition, TraceEntry
from instanced_stream.core.plan_graph import Step

__all__ = [
    "Change",
    "Ended",
    "InstanceState",
    "MemoryStore",
    "Pending",
    "StateStore",
    "Write",
    "alternatives",
    "path_problem",
    "read_path",
    "write_path",
]

Status = Literal["new", "pending", "ready", "awaiting_approval", "done"]


class Pending(BaseModel):
    tool: str
    paths: list[str] = Field(description="Where the result may go (two or more: a branch)")
    deadline: float = Field(description="Unix time after which the call counts as failed")
    turn: int


class Ended(BaseModel):
    """How a workflow ended: done, stopped, turn_limit, rejected, or dead_lettered."""

    status: str
    reason: str
    at: float


class InstanceState(BaseModel):
    """One instance's workflow state: the value of its record on the state changelog.

    A field the model no longer has is ignored on read and not written again: records on
    a changelog written by an older version still load (a compacted changelog keeps them
    until their key is written again)."""

    model_config = ConfigDict(extra="ignore")

    instance: str
    partition: int
    source: SourcePosition | None = None
    input: dict[str, Any] = Field(default_factory=dict)
    state: dict[str, Any] = Field(default_factory=dict)
    turn: int = 0
    status: Status = "new"
    pending: dict[str, Pending] = Field(default_factory=dict)
    proposal: list[dict[str, Any]] = Field(default_factory=list)
    proposal_id: str = Field(
        default="", description="The pending proposal's id: only an approval naming it counts"
    )
    trace: list[TraceEntry] = Field(default_factory=list)
    plan: list[Step] = Field(
        default_factory=list, description="The model's plan for this instance (its graph)"
    )
    applied: list[str] = Field(
        default_factory=list, description="Recent triggers already applied (idempotence)"
    )
    ended: Ended | None = None
    revisions: list[dict[str, Any]] = Field(
        default_factory=list,
        description="A lazy plan's rejected proposals: each version's steps and the reason",
    )
    revising: bool = Field(False, description="Rejected: its next turn plans again")
    counts: dict[str, int] = Field(
        default_factory=dict,
        description="What its plan's run counted: skipped_branch, ran_on_missing_input",
    )
    owner: str = Field(
        default="", description="The processor that last changed this state (its worker id)"
    )

    def mark(self, trigger: str) -> bool:
        """Records a trigger; False when it was applied before (a redo)."""
        if trigger in self.applied:
            return False
        self.applied = [*self.applied[-49:], trigger]
        return True


def alternatives(output_path: str) -> list[str]:
    """`†state.sunny || †state.rainy` -> ['†state.sunny', '†state.rainy']."""
    return [p.strip() for p in output_path.split("||") if p.strip()]


def path_problem(path: str, value: Any) -> str | None:
    """Why `value` cannot be written at `path`, or None. Checked before `write_path`: a
    result is data from outside, and refusing it must never be an exception."""
    if not path.startswith("†state"):
        return f"output paths must start with †state, got {path!r}"
    root = not [k for k in path.removeprefix("†state").split(".") if k]
    if root and not isinstance(value, dict):
        return f"only an object can be written to †state itself, not {type(value).__name__}"
    return None


def write_path(state: dict[str, Any], path: str, value: Any) -> None:
    """Writes `value` at a `†state.a.b` path; `†state` alone merges an object in.
    Raises ValueError where `path_problem` names a problem."""
    problem = path_problem(path, value)
    if problem is not None:
        raise ValueError(problem)
    keys = [k for k in path.removeprefix("†state").split(".") if k]
    if not keys:
        state.update(value)
        return
    node = state
    for key in keys[:-1]:
        child = node.get(key)
        if not isinstance(child, dict):
            child = node[key] = {}
        node = child
    node[keys[-1]] = value


def read_path(state: dict[str, Any], path: str) -> Any:
    keys = [k for k in path.removeprefix("†state").split(".") if k]
    node: Any = state
    for key in keys:
        if not isinstance(node, dict) or key not in node:
            return None
        node = node[key]
    return node


class StateStore(Protocol):
    def get(self, instance: str) -> InstanceState | None: ...

    def put(self, value: InstanceState) -> None: ...

    def items(self) -> Iterator[InstanceState]: ...

    def delete(self, instance: str, partition: int) -> None: ...

    def retired(self) -> Iterator[tuple[str, float, int]]:
        """The finished states kept out of memory (not in `items`): each one's instance,
        when it ended, and its partition."""
        ...

    def retired_at(self, instance: str) -> float | None:
        """When the workflow of `instance` ended, if its state is kept out of memory."""
        ...

    async def flush(self) -> None:
        """Returns once every write so far is durable (a no-op where writes are)."""


class MemoryStore:
    """The same contract in a dict, for unit tests."""

    def __init__(self) -> None:
        self.data: dict[str, InstanceState] = {}

    def get(self, instance: str) -> InstanceState | None:
        found = self.data.get(instance)
        return found.model_copy(deep=True) if found else None

    def put(self, value: InstanceState) -> None:
        self.data[value.instance] = value.model_copy(deep=True)

    def items(self) -> Iterator[InstanceState]:
        return iter([v.model_copy(deep=True) for v in self.data.values()])

    def delete(self, instance: str, partition: int) -> None:
        self.data.pop(instance, None)

    def retired(self) -> Iterator[tuple[str, float, int]]:
        return iter(())  # every state is kept in the dict

    def retired_at(self, instance: str) -> float | None:
        return None

    async def flush(self) -> None:
        return None


class Write(NamedTuple):
    """One held write of a `Change`: an instance's new state, or its deletion (None)."""

    instance: str
    partition: int
    state: InstanceState | None


class Change:
    """A state change being made, over a store that it only reads: its own reads see its
    writes, the store sees none of them until they are taken (`take`) and written by the
    caller. A trigger's effects (its records, its next turn) are known before anything is
    stored, and a change that fails part-way stores nothing (runtime/state/transaction.py
    writes a taken change into the units' stores, with its changelog records)."""

    def __init__(self, base: StateStore) -> None:
        self.base = base
        self._held: dict[str, Write] = {}  # by instance, in the order first written

    def get(self, instance: str) -> InstanceState | None:
        held = self._held.get(instance)
        if held is None:
            return self.base.get(instance)
        return held.state.model_copy(deep=True) if held.state is not None else None

    def put(self, value: InstanceState) -> None:
        held = Write(value.instance, value.partition, value.model_copy(deep=True))
        self._held[value.instance] = held

    def items(self) -> Iterator[InstanceState]:
        for value in self.base.items():
            if value.instance not in self._held:
                yield value
        for held in list(self._held.values()):
            if held.state is not None:
                yield held.state.model_copy(deep=True)

    def delete(self, instance: str, partition: int) -> None:
        self._held[instance] = Write(instance, partition, None)

    def retired(self) -> Iterator[tuple[str, float, int]]:
        return (r for r in self.base.retired() if r[0] not in self._held)

    def retired_at(self, instance: str) -> float | None:
        return None if instance in self._held else self.base.retired_at(instance)

    async def flush(self) -> None:
        return None

    @property
    def names(self) -> list[str]:
        """The instances it holds a write of."""
        return list(self._held)

    def take(self, instance: str | None = None) -> list[Write]:
        """The held writes (of `instance` only, or all of them), which leave the change."""
        if instance is None:
            taken, self._held = list(self._held.values()), {}
            return taken
        held = self._held.pop(instance, None)
        return [] if held is None else [held]
