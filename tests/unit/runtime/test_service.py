"""The processor's timers survive their steps' errors (issue 24: a timer's exception,
an `end_offsets` timeout in a rebalance, stopped the whole worker), and its run: a crash
exits 1, SIGTERM stops it once, SIGUSR1 dumps the tasks, a failed start closes what it
opened and raises its error for the CLI to say."""

from __future__ import annotations

import asyncio
import os
import signal

import mode
import pytest
from instanced_stream import termination
from instanced_stream.runtime.service import every, run_until_signalled


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


class _Probe(mode.Service):
    """A service that records its stops and can crash one of its supervised tasks."""

    def __init__(self, crash: bool) -> None:
        super().__init__()
        self.crash_it = crash
        self.stops = 0
        self.up = asyncio.Event()

    async def on_started(self) -> None:
        self.up.set()
        if self.crash_it:
            self.add_future(self._fail())

    async def _fail(self) -> None:
        await asyncio.sleep(0.01)
        raise RuntimeError("a partition that keeps failing")

    async def on_stop(self) -> None:
        self.stops += 1


async def test_a_crashed_task_stops_the_service_once_with_exit_code_one() -> None:
    service = _Probe(crash=True)
    code = await asyncio.wait_for(run_until_signalled(service), 10)
    assert code == 1
    assert service.stops == 1


async def test_sigterm_twice_stops_once_with_exit_code_zero_and_restores_the_handler() -> None:
    before = signal.getsignal(signal.SIGTERM)
    service = _Probe(crash=False)
    running = asyncio.create_task(run_until_signalled(service))
    await asyncio.wait_for(service.up.wait(), 10)
    os.kill(os.getpid(), signal.SIGTERM)
    os.kill(os.getpid(), signal.SIGTERM)
    assert await asyncio.wait_for(running, 10) == 0
    assert service.stops == 1
    assert signal.getsignal(signal.SIGTERM) is before


async def test_sigusr1_writes_every_tasks_stack_to_stderr(
    capsys: pytest.CaptureFixture[str],
) -> None:
    service = _Probe(crash=False)
    running = asyncio.create_task(run_until_signalled(service))
    await asyncio.wait_for(service.up.wait(), 10)
    os.kill(os.getpid(), signal.SIGUSR1)
    await asyncio.sleep(0.1)
    os.kill(os.getpid(), signal.SIGTERM)
    assert await asyncio.wait_for(running, 10) == 0
    assert "run_until_signalled" in capsys.readouterr().err


class _FailsToStart(mode.Service):
    """A service whose start opens a client, then fails (as a refused login would)."""

    def __init__(self) -> None:
        super().__init__()
        self.opened = False
        self.stops = 0

    async def on_start(self) -> None:
        self.opened = True
        raise ConnectionError("no broker at that address")

    async def on_stop(self) -> None:
        self.stops += 1
        self.opened = False


async def test_a_failed_start_closes_what_it_opened_and_raises_its_error() -> None:
    before = signal.getsignal(signal.SIGTERM)
    service = _FailsToStart()
    with pytest.raises(ConnectionError, match="no broker"):
        await asyncio.wait_for(run_until_signalled(service), 10)
    assert service.stops == 1
    assert not service.opened
    assert signal.getsignal(signal.SIGTERM) is before


async def test_a_sigterm_recorded_while_it_started_stops_it_as_soon_as_its_handlers_are_in(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The CLI's start defers a SIGTERM (`termination`): the one that came before the
    service's own handlers were installed is acted on by them, not lost."""
    monkeypatch.setattr(termination._Request, "asked", True)
    service = _Probe(crash=False)
    assert await asyncio.wait_for(run_until_signalled(service), 10) == 0
    assert service.stops == 1
