"""The batch ledger: which Batch API lines this processor submitted, and which instances
(input records and turns) each one asks about, kept in the units' state.

A submitted line is a changelog record (key: its custom id) on the batches changelog, at
the partition of every instance it asks about, staged on that partition's unit and
committed with its next transaction, while the instances' own slots stay open: their
input offsets are committed only with their outcomes. Those outcomes carry the line's
tombstone, on the slot of the partition's last item, so it is committed in the same
transaction as the last of them, never before. A unit opened after a crash or a
rebalance restores its partition of the changelog: every line there asks about items
the unit is about to read again, and is polled instead of being submitted again.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass

import orjson

from instanced_stream.kafka.records import OutRecord
from instanced_stream.kafka.topics import read_changelog

__all__ = ["Ledger", "Line", "partition_of"]

# A line older than this was submitted so long ago (twice the 24 h completion window)
# that its outcome was committed or its items went elsewhere: dropped at restore.
_STALE_S = 48 * 3600.0


def partition_of(key: str) -> int:
    """The partition in an `Instance.key` (`topic/partition/offset/turn`; a Kafka topic
    name has no slash)."""
    return int(key.rsplit("/", 3)[1])


def _offset_of(key: str) -> int:
    return int(key.rsplit("/", 3)[2])


@dataclass(frozen=True, slots=True)
class Line:
    custom_id: str
    batch: str
    keys: tuple[str, ...]
    submitted_at: float

    def value(self) -> bytes:
        return orjson.dumps(
            {"batch": self.batch, "keys": list(self.keys), "submitted_at": self.submitted_at}
        )

    @classmethod
    def parse(cls, custom_id: str, raw: bytes) -> Line:
        data = orjson.loads(raw)
        return cls(custom_id, str(data["batch"]), tuple(data["keys"]), float(data["submitted_at"]))


class Ledger:
    def __init__(self, topic: str) -> None:
        self.topic = topic
        self.lines: dict[str, Line] = {}
        self._by_key: dict[str, set[str]] = defaultdict(set)

    def __len__(self) -> int:
        return len(self.lines)

    async def restore(self, bootstrap: str, partition: int) -> list[Line]:
        """The lines recorded at `partition` (read committed), now known here."""
        found: list[Line] = []
        now = time.time()
        for custom_id, raw in (await read_changelog(bootstrap, self.topic, partition)).items():
            line = Line.parse(custom_id, raw)
            if now - line.submitted_at < _STALE_S:
                found.append(line)
                self._add(line)
        return found

    def drop(self, partition: int) -> None:
        """The partition went elsewhere: its lines are its new owner's."""
        for custom_id, line in list(self.lines.items()):
            if all(partition_of(k) == partition for k in line.keys):
                self._remove(custom_id)

    def _add(self, line: Line) -> None:
        self.lines[line.custom_id] = line
        for key in line.keys:
            self._by_key[key].add(line.custom_id)

    def _remove(self, custom_id: str) -> Line | None:
        line = self.lines.pop(custom_id, None)
        if line is not None:
            for key in line.keys:
                ids = self._by_key.get(key)
                if ids is not None:
                    ids.discard(custom_id)
                    if not ids:
                        del self._by_key[key]
        return line

    def first_line(self, key: str) -> Line | None:
        """The earliest submitted line that asks about `key` (a re-ask's line follows it)."""
        ids = self._by_key.get(key)
        if not ids:
            return None
        return min((self.lines[c] for c in ids), key=lambda x: x.submitted_at)

    def submitted(
        self, batch_id: str, lines: list[tuple[str, tuple[str, ...]]]
    ) -> dict[int, list[OutRecord]]:
        """Per partition, the changelog records of these lines (a line again under a new
        batch id overwrites its record)."""
        out: dict[int, list[OutRecord]] = defaultdict(list)
        now = time.time()
        for custom_id, keys in lines:
            line = Line(custom_id, batch_id, keys, now)
            self._remove(custom_id)
            self._add(line)
            value = line.value()
            for partition in sorted({partition_of(k) for k in keys}):
                out[partition].append(
                    OutRecord(self.topic, custom_id.encode(), value, None, partition)
                )
        return dict(out)

    def settled(self, keys: list[str]) -> dict[int, list[OutRecord]]:
        """Per partition, the tombstones of every line asking about these keys, whose
        outcomes are being staged now."""
        ids = {c for k in keys for c in self._by_key.get(k, ())}
        out: dict[int, list[OutRecord]] = defaultdict(list)
        for custom_id in sorted(ids):
            line = self._remove(custom_id)
            if line is None:
                continue
            for partition in sorted({partition_of(k) for k in line.keys}):
                out[partition].append(
                    OutRecord(self.topic, custom_id.encode(), b"", None, partition)
                )
        return dict(out)


def last_by_partition(keys: list[str]) -> dict[int, str]:
    """Per partition, the key of the highest offset (its slot is committed last)."""
    out: dict[int, str] = {}
    for key in keys:
        p = partition_of(key)
        if p not in out or _offset_of(key) > _offset_of(out[p]):
            out[p] = key
    return out
