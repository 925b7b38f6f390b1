"""How long one request may take: the spec's timeout, or longer when the answer it may
legitimately write needs longer on this endpoint.

A fixed timeout fails a slow endpoint's large batches every time (a CPU model writing a
100-instance answer at ~95 tokens/s needs more than a minute), and each timeout halves the
batch and asks again: the whole window is paid several times before any item is decided.
So the deadline follows the request's output cap at the endpoint's measured output rate
(the slowest recent one, from completed answers), with room for the prompt, never below
the spec's `timeout_s` and never above `_MOST` times it.
"""

from __future__ import annotations

from collections import deque

__all__ = ["Deadline"]

_KEEP = 8  # recent answers whose output rate is remembered
_ROOM = 1.5  # an answer may run this much slower than the slowest recent one
_MOST = 10.0  # a deadline is at most this many times the spec's timeout
_MIN_TOKENS = 32  # answers shorter than this say little about the output rate


class Deadline:
    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.rates: deque[float] = deque(maxlen=_KEEP)
        self.grow = 1.0  # while nothing was ever answered: doubled by each timeout

    def timed_out(self) -> None:
        """A request timed out. Before any answer was measured (the start-up probe timed
        out too: a loaded CPU endpoint), the timeout itself is the suspect: the next
        deadline doubles, up to the bound, instead of halving batches that could never
        be answered within it."""
        if not self.rates:
            self.grow = min(self.grow * 2, _MOST)

    def observe(self, completion_tokens: int, latency_s: float, least: int = _MIN_TOKENS) -> None:
        """A completed answer: its output tokens per second (latency includes the prompt,
        so this underestimates the rate: the deadline errs on the long side). `least`:
        the start-up probe's short answer is the only measure before the first batch."""
        if completion_tokens >= least and latency_s > 0:
            self.rates.append(completion_tokens / latency_s)
            self.grow = 1.0

    def timeout_for(self, cap: int | None) -> float:
        """The deadline of a request that may write up to `cap` tokens."""
        if cap is None or not self.rates:
            return self.timeout_s * self.grow
        needed = cap / min(self.rates) * _ROOM
        return min(max(self.timeout_s, needed), self.timeout_s * _MOST)
