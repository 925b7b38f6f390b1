"""A task that runs beside a measured run for as long as `async with` holds it: started on
entry, cancelled and awaited on exit. The pollers and readers of the harness (who owns
which partition, the group as the broker describes it, the topics as they fill) are
each one."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Self

__all__ = ["Background"]


class Background:
    """Subclasses write `_run` (a loop that ends only when cancelled) and may prepare what
    it needs in `_open`, before the task starts."""

    _task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Self:
        await self._open()
        self._task = asyncio.create_task(self._run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _open(self) -> None:
        """What `_run` needs, made before it starts (a started consumer)."""

    async def _run(self) -> None:
        raise NotImplementedError
