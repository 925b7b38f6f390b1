"""The named moments of the pipeline, and the seam that lets a test act at them.

The fault campaign needs a processor to stop at exact moments (the development
distribution's `instanced_stream_bench.testing.faults` says what each point means). The
pipeline's pieces take a `Probe` at construction and tell it when they pass a point; in
production that is `NO_PROBE`, which does nothing, so no test code runs on the hot path.
When STREAM_CRASH_AT is set, `stream process` asks `injector` for a probe, which comes from
the entry point group `INJECTORS`: the product itself ships none, so a deployment cannot
arm a fault point by accident. The points and the `STREAM_CRASH_AT` grammar live here, at
the bottom floor, so that the settings can refuse a misspelt point without loading the
test package.
"""

from __future__ import annotations

from importlib.metadata import entry_points
from typing import Protocol

from instanced_stream.errors import StreamError

__all__ = ["INJECTORS", "NO_PROBE", "POINTS", "NoProbe", "Probe", "injector", "parse"]

# Where a fault injector is found: an entry point that takes the STREAM_CRASH_AT value and
# returns the armed Probe (packages/bench/pyproject.toml declares the campaign's).
INJECTORS = "instanced_stream.fault_injectors"

# The points the pipeline's probe passes: an unknown name in STREAM_CRASH_AT would
# silently never fire, so `parse` refuses it.
POINTS = frozenset(
    {
        "solved",
        "after_llm",
        "mid_commit",
        "after_commit",
        "after_result",
        "after_approval",
        "joined",
    }
)


def parse(spec: str) -> tuple[str, int, bool, bool]:
    """`[raise:]POINT:N[+]` -> (point, n, kill, onwards)."""
    parts = spec.strip().split(":")
    kill = parts[0] != "raise"
    if not kill:
        parts = parts[1:]
    count = parts[-1].removesuffix("+") if len(parts) == 2 else ""
    onwards = not kill and parts[-1].endswith("+")
    if len(parts) != 2 or parts[0] not in POINTS or not count.isdigit() or int(count) < 1:
        raise ValueError(
            f"crash point {spec!r}: expected [raise:]POINT:N (raise: also N+) with N >= 1 "
            f"and POINT one of {', '.join(sorted(POINTS))}"
        )
    if kill and parts[-1].endswith("+"):
        raise ValueError(f"crash point {spec!r}: a process can be killed only once")
    return parts[0], int(count), kill, onwards


class Probe(Protocol):
    def at(self, point: str) -> None:
        """The pipeline passes `point`; may raise (or end the process) there."""

    def watches(self, point: str) -> bool:
        """True when `at(point)` may act: lets a caller set up the moment it names."""


class NoProbe:
    """The production probe: every point passes without a trace."""

    def at(self, point: str) -> None:
        return None

    def watches(self, point: str) -> bool:
        return False


NO_PROBE = NoProbe()


def injector(crash_at: str) -> Probe:
    """The probe armed at `crash_at`, from the installed fault injector (the module
    docstring); refused when none is installed."""
    for point in entry_points(group=INJECTORS):
        made: Probe = point.load()(crash_at)
        return made
    raise StreamError(
        "STREAM_CRASH_AT is set, but no fault injector is installed: it comes with the "
        "development distribution (instanced-stream-bench); unset STREAM_CRASH_AT"
    )
