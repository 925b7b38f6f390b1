"""The processor's timers survive their steps' errors (issue 24: a timer's exception,
an `end_offsets` timeout in a rebalance, stopped the whole worker)."""

from __future__ import annotations

import asyncio

from instanced_stream.runtime.service import every


async def test_a_timer_logs_counts_and_goes_on_after_its_step_fails() -> None:
    calls: list[int] = []
    failures: list[int] = []

    async def step() -> None:
        calls.append(len(calls))
        if len(calls) <= 2:
            raise TimeoutError("end_offsets timed out")

    task = asyncio.create_task(every(0.01, step, lambda: failures.append(1)))
    try:
        for _ in range(200):
            if len(calls) >= 4:
                break
            await asyncio.sleep(0.01)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert len(calls) >= 4, "the timer stopped after its step failed"
    assert len(failures) == 2
    assert task.cancelled()
