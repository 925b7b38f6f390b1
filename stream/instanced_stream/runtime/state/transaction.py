"""A state change as one transaction over the units' stores: `with stores.change() as tx:`.

A trigger (an input's admission, a batch's turns, a result, an approval, a deadline) runs
its workflow over the transaction (`Workflow.over`): reads see its writes, the stores see
none of them. On a clean exit of the `with` (or `commit`, for a batch, one item at a time)
the writes are stored and their changelog records come back (`records`), for the caller
to stage on the trigger's slot with the outputs they belong to, so state and outputs commit
in one Kafka transaction or not at all. An error inside the `with` stores nothing; a state
past the broker's limit is refused (`BadRecord`) before any write of the commit is stored.

Nothing may await between the first read of a transaction and its commit: the states it
read are then still the stores' own (no other trigger of the process ran meanwhile).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from types import TracebackType
from typing import Protocol

from instanced_stream.core.state import Change, StateStore, Write
from instanced_stream.kafka.records import OutRecord

__all__ = ["Transaction", "Writable"]


class Writable(StateStore, Protocol):
    """What a transaction writes into (`runtime/state/store.py` `Stores`)."""

    def encoded(self, write: Write) -> bytes | None: ...

    def write(self, write: Write, raw: bytes | None = None) -> OutRecord | None: ...


class Transaction(Change):
    """A `Change` of the stores that stores itself: on a clean `with` exit, or `commit`."""

    def __init__(self, stores: Writable) -> None:
        super().__init__(stores)
        self.stores = stores
        self.by_partition: defaultdict[int, list[OutRecord]] = defaultdict(list)
        self._followers: list[Callable[[Iterable[Write]], None]] = []

    def followed_by(self, follower: Callable[[Iterable[Write]], None]) -> Transaction:
        """`follower` is told each commit's writes (the workflow's deadlines follow them)."""
        self._followers.append(follower)
        return self

    def __enter__(self) -> Transaction:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        if kind is None:
            self.commit()
        else:
            self.take()  # an error part-way: nothing of it is stored

    def commit(self, instance: str | None = None) -> list[OutRecord]:
        """Stores the held writes (of `instance` only, or all); returns their changelog
        records. BadRecord: one would pass the broker's limit, and none is stored."""
        writes = self.take(instance)
        raws = [self.stores.encoded(w) for w in writes]  # refused before anything is stored
        records = []
        for write, raw in zip(writes, raws, strict=True):
            record = self.stores.write(write, raw)
            if record is not None:
                records.append(record)
                self.by_partition[write.partition].append(record)
        for follower in self._followers:
            follower(writes)
        return records

    @property
    def records(self) -> list[OutRecord]:
        """Every changelog record its commits made so far."""
        return [r for part in self.by_partition.values() for r in part]
