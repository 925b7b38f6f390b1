"""Test-only fault injection: crash (or raise) at a named point of the pipeline.

The fault campaign needs a processor to die at exact moments (after the model answered
but before the publish, between the publishes of one batch, after publishing but before
the commit), which a kill from outside cannot hit reliably. `STREAM_CRASH_AT` arms one
point for one process:

- `after_llm:3`: SIGKILL this process the 3rd time the point `after_llm` is reached;
- `raise:after_llm:1`: raise `InjectedFault` there the 1st time instead (a bug in the
  batch body, as the code around the point sees it); `raise:solved:2+`: raise on the
  2nd time and every time after.

The points: `solved` (runtime/pipeline/dispatch.py: every model answer of a batch in hand, no record
built yet, inside the batch's retry), `after_llm` (dispatch.py: the batch's records built,
none staged on a unit yet, inside the retry), `mid_commit` (runtime/units/unit.py: every record
of a commit sent and its offsets too, the transaction still open), `after_commit`
(unit.py: a commit done, before the unit goes on), `after_result` and `after_approval`
(runtime/service.py: a result's or an approval's change staged on its unit, not yet
committed), `joined` (runtime/units/assignor.py: the group answered the member's join
with its partitions, which it has not taken yet).

The pipeline never calls this module: its pieces take a `instanced_stream.faultpoints.Probe`,
and `stream process` asks for one (`injector`, found through the entry point group
`instanced_stream.faultpoints.INJECTORS`) only when STREAM_CRASH_AT is set.
"""

from __future__ import annotations

import logging
import os
import signal
from dataclasses import dataclass

from instanced_stream.errors import StreamError
from instanced_stream.faultpoints import POINTS, parse

__all__ = [
    "POINTS",
    "FaultProbe",
    "InjectedFault",
    "arm",
    "armed",
    "crash_point",
    "injector",
    "parse",
]

log = logging.getLogger("stream.faults")


class InjectedFault(StreamError):
    """Raised by an armed `raise:` crash point; never raised in production."""


@dataclass(slots=True)
class _Trap:
    point: str
    at: int
    kill: bool
    onwards: bool = False
    seen: int = 0


_trap: _Trap | None = None


def arm(spec: str | None) -> None:
    """Arms one crash point for this process (None or empty: disarms)."""
    global _trap
    if not spec:
        _trap = None
        return
    point, at, kill, onwards = parse(spec)
    _trap = _Trap(point, at, kill, onwards)
    log.warning("fault injection armed: %s at hit %d of %s", "kill" if kill else "raise", at, point)


def armed(name: str) -> bool:
    """True when `name` is the armed point: lets a caller prepare the moment it names."""
    return _trap is not None and _trap.point == name


def crash_point(name: str) -> None:
    """A named moment of the pipeline; a no-op unless armed for it."""
    trap = _trap
    if trap is None or trap.point != name:
        return
    trap.seen += 1
    if trap.seen < trap.at or (trap.seen > trap.at and not trap.onwards):
        return
    if trap.kill:
        # Flushed first so the test can see which moment the process died at.
        log.warning("fault injection: SIGKILL at %s (hit %d)", name, trap.seen)
        for handler in logging.getLogger().handlers:
            handler.flush()
        os.kill(os.getpid(), signal.SIGKILL)
    log.warning("fault injection: raising at %s (hit %d)", name, trap.seen)
    raise InjectedFault(f"injected fault at {name} (hit {trap.seen})", point=name)


class FaultProbe:
    """The pipeline's probe (instanced_stream.faultpoints.Probe) for the fault campaign: every
    point goes through the armed trap."""

    def at(self, point: str) -> None:
        crash_point(point)

    def watches(self, point: str) -> bool:
        return armed(point)


def injector(crash_at: str) -> FaultProbe:
    """The entry point `stream process` loads when STREAM_CRASH_AT is set: arms the point
    for this process and returns the probe the pipeline passes it through."""
    arm(crash_at)
    return FaultProbe()
