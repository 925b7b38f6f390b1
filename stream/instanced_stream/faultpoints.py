"""The named moments of the pipeline, and the seam that lets a test act at them.

The fault campaign needs a processor to stop at exact moments (testing/faults.py says
what each point means). The pipeline's pieces take a `Probe` at construction and tell it
when they pass a point; in production that is `NO_PROBE`, which does nothing, so no test
code runs on the hot path. `stream process` passes the fault injector instead when
STREAM_CRASH_AT is set. The points and the `STREAM_CRASH_AT` grammar live here, at the
bottom floor, so that the settings can refuse a misspelt point without loading the test
package.
"""

from __future__ import annotations

from typing import Protocol

__all__ = ["NO_PROBE", "POINTS", "NoProbe", "Probe", "parse"]

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
