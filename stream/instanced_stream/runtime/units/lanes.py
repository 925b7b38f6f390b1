"""Lanes: the results and approvals of each owned partition, applied in order by a task of
the partition's own, off the fetch loop.

Applying one may first read a finished state back from the changelog (runtime/state/
recall.py): up to seconds while the changelog is slow. Done in the fetch loop, that held
every partition of the member, and the consumer's poll with them. Here a lane waits
alone: other partitions' answers and every input go on, and the group keeps hearing
from the member. Within a partition the order of its records is kept, as its slots
commit in offset order. Any error while applying one fails that partition's unit (it is
reopened after a back-off and the record redone), never the process.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from instanced_stream.runtime.units.fetcher import Fetched
from instanced_stream.runtime.units.unit import Unit, UnitGone

__all__ = ["Lanes"]

log = logging.getLogger("stream.processor")


class Lanes:
    """`apply`: what one result or approval does (stages its change on its slot)."""

    def __init__(self, apply: Callable[[Fetched], Awaitable[None]]) -> None:
        self.apply = apply
        self._lanes: dict[Unit, tuple[asyncio.Queue[Fetched], asyncio.Task[None]]] = {}

    def put(self, got: Fetched) -> None:
        lane = self._lanes.get(got.unit)
        if lane is None:
            queue: asyncio.Queue[Fetched] = asyncio.Queue()
            task = asyncio.create_task(
                self._run(got.unit, queue), name=f"lane-{got.unit.partition}"
            )
            lane = self._lanes[got.unit] = (queue, task)
        lane[0].put_nowait(got)

    def waiting(self) -> int:
        """Records queued in every lane, not applied yet."""
        return sum(queue.qsize() for queue, _task in self._lanes.values())

    async def _run(self, unit: Unit, queue: asyncio.Queue[Fetched]) -> None:
        while True:
            got = await queue.get()
            try:
                unit.check()
                await self.apply(got)
            except asyncio.CancelledError:
                raise
            except UnitGone:
                return  # its partition is reopened (or gone): the record is redone there
            except Exception as exc:
                log.exception("partition %d: a result or approval failed", unit.partition)
                unit.fail(exc)

    def drop(self, unit: Unit) -> None:
        """The unit closed: its lane stops; what it had queued is its next owner's (or this
        member's again, from the last commit)."""
        lane = self._lanes.pop(unit, None)
        if lane is not None:
            lane[1].cancel()

    async def stop(self) -> None:
        tasks = [task for _queue, task in self._lanes.values()]
        self._lanes.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
