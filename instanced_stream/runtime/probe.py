"""A seam for observing named moments of the pipeline from outside.

The fault campaign needs a processor to stop at exact moments (see
instanced_stream/testing/faults.py for the points and what each means). The
pipeline's pieces take a `Probe` at construction and tell it when they pass a point; in
production that is `NO_PROBE`, which
does nothing, so no test code runs on the hot path. `stream process` passes the fault
injector instead when STREAM_CRASH_AT is set.
"""

from __future__ import annotations

from typing import Protocol

__all__ = ["NO_PROBE", "NoProbe", "Probe"]


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
