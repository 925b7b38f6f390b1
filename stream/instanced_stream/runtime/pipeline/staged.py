"""An instance on its way through a window (`Staged`): what the stager batches, the tier
it is given parks or windows, and the solved batch stages on the instance's unit; and a
consumed record whose outcome is known before any window (`Settled`), which staging
writes like any other."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from instanced_stream.core.instance import Instance
from instanced_stream.core.tokenizer import Tokenizer
from instanced_stream.kafka.records import OutRecord
from instanced_stream.runtime.pipeline.outcomes.records import Planned
from instanced_stream.runtime.pipeline.windows.twins import Twins
from instanced_stream.runtime.units.unit import Slot, Unit

__all__ = ["Settled", "Staged", "bound_of", "freeing", "tokens_of"]


@dataclass(slots=True, eq=False)
class Staged:
    """An instance in a window, with the unit and slot its outcome is staged on."""

    instance: Instance
    unit: Unit
    slot: Slot | None  # None: a workflow's next turn (its input was committed before)
    text: bytes
    tokens: int | None = None
    changes: list[OutRecord] = field(default_factory=list)  # its admission's state change


@dataclass(frozen=True, slots=True)
class Settled:
    """A consumed record's outcome, known before any window (a dead letter, a forwarded
    copy, a turn committed before, a result nothing awaits): `planned`'s records are
    written on `slot` of `unit` by staging, the one writer of outcomes, and what they
    mean is counted there."""

    unit: Unit
    slot: Slot
    planned: Planned


def freeing(twins: Twins) -> Callable[[Staged], bool]:
    """What the windower asks of each item it adds: whether it is free (not asked, its
    content's twin is: `Twins.free`)."""

    def free(item: Staged) -> bool:
        return twins.free(item.instance)

    return free


def tokens_of(tokenizer: Tokenizer, item: Staged) -> int:
    """The item's tokens, counted once."""
    if item.tokens is None:
        item.tokens = tokenizer.count(item.text.decode("utf-8", "replace"))
    return item.tokens


def bound_of(tokenizer: Tokenizer, item: Staged) -> int:
    """A cheap upper bound of the item's tokens, or its count once known."""
    return tokenizer.bound(len(item.text)) if item.tokens is None else item.tokens
