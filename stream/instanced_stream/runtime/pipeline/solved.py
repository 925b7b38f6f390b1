"""A solved batch, as dispatch hands it to staging: the records that say what became of
its items, and the transaction its turns were made on (runtime/state/transaction.py)."""

from __future__ import annotations

from dataclasses import dataclass

from instanced_stream.runtime.pipeline.outcomes.records import Planned
from instanced_stream.runtime.state.transaction import Transaction

__all__ = ["Solved"]


@dataclass(frozen=True, slots=True)
class Solved:
    """`planned`: the batch's records; `change`: the transaction its turns were made on
    (None: stateless), stored by staging item by item, each with the item's records."""

    planned: Planned
    change: Transaction | None = None
