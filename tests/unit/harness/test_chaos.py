"""`stream demo --chaos N` without a broker: the kills, each victim restarted, aimed at
a processor whose live API shows consumed records not yet committed (and counted when one
did), the same victims for the same seed; the demo itself runs in
tests/integration/test_exactly_once.py."""

from __future__ import annotations

import time
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestServer
from instanced_stream_bench.harness.chaos import Chaos, Process, uncommitted_at
from instanced_stream_bench.testing.broker import free_port


class _Proc:
    """A processor as the chaos sees it: its live API's port, kill and start counted."""

    def __init__(self, port: int) -> None:
        self.env = {"STREAM_WEB_PORT": str(port)}
        self.kills = 0
        self.starts = 0

    def kill(self) -> None:
        self.kills += 1

    def start(self) -> None:
        self.starts += 1


async def _live(*answers: dict[str, int]) -> TestServer:
    """A live API answering `units` with each of `answers` in turn, then the last."""
    seen = []

    async def live(_: web.Request) -> web.Response:
        seen.append(1)
        return web.json_response({"units": answers[min(len(seen), len(answers)) - 1]})

    app = web.Application()
    app.router.add_get("/api/live", live)
    server = TestServer(app)
    await server.start_server()
    return server


async def _storm(procs: list[_Proc], seed: int) -> Chaos:
    victims: list[Process] = list(procs)
    chaos = Chaos(victims, 5, lambda _: None, seed=seed, first_s=0.5, between_s=(0.0, 0.0))
    chaos.aim_s = 0.1
    await chaos.run()
    return chaos


async def test_every_kill_restarts_its_victim_and_counts_whether_it_found_work() -> None:
    server = await _live({"0": 3, "1": 0})
    try:
        busy, idle = _Proc(server.port or 0), _Proc(free_port())  # idle: nothing answers
        chaos = await _storm([busy, idle], seed=3)
        again = [_Proc(server.port or 0), _Proc(free_port())]
        await _storm(again, seed=3)
    finally:
        await server.close()
    assert busy.kills + idle.kills == 5 and len(chaos.done) == 5
    assert (busy.starts, idle.starts) == (busy.kills, idle.kills)  # each one restarted
    assert busy.kills and idle.kills  # the seed picks both (a precondition)
    assert chaos.with_work == busy.kills  # only the busy one showed uncommitted records
    assert chaos.done == sorted(chaos.done) and chaos.done[0] >= 0.5
    assert [p.kills for p in again] == [busy.kills, idle.kills]  # the seed replays them
    summary: dict[str, Any] = chaos.summary()
    assert summary == {
        "processors": 2,
        "kills_asked": 5,
        "kills_done": 5,
        "kills_with_work": busy.kills,
        "at_s": chaos.done,
        "seed": 3,
    }


async def test_the_aim_waits_for_uncommitted_records_and_gives_up_after_its_time() -> None:
    server = await _live({"0": 0}, {"0": 0, "1": 2})
    try:
        assert await uncommitted_at(server.port or 0, 5.0) == {"0": 0, "1": 2}
    finally:
        await server.close()
    began = time.monotonic()
    assert await uncommitted_at(free_port(), 0.3) == {}  # not serving: no work seen
    assert time.monotonic() - began < 3
