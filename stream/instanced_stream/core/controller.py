"""The window that follows agreement: the largest window whose decisions, compared with
the same items asked alone (the shadow sample), keep `quality.min_agreement`.

Judged per window bucket (`quality.bucket_of`) on the latest comparisons, with the
Wilson interval of `quality.wilson` and at least `min_sample` of them:
- the current window's bucket is shown below the target (its upper bound under it, or
  twice the sample a perfect record needs to prove the target and a lower bound still
  under it): the window halves at once (shrink fast);
- its lower bound is at or above the target, on `min_sample` comparisons made since the
  last change: it grows by a quarter (at least one item; grow slowly), never into a
  bucket recently shown below the target, never past `window.max_items`.
Comparisons age out (a bounded memory), so a bucket once shown bad is tried again later.
Every change is returned with the figures behind it, for the log and the live page.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from instanced_stream.core.quality import bucket_of, wilson

__all__ = ["Change", "WindowController"]


@dataclass(frozen=True, slots=True)
class Change:
    """One decision of the controller and what it was based on."""

    old: int
    new: int
    bucket: str
    agreed: int
    compared: int
    lower: float
    upper: float
    target: float

    @property
    def why(self) -> str:
        verb = "shrinks" if self.new < self.old else "grows"
        return (
            f"window {verb} {self.old} -> {self.new}: agreement at window {self.bucket} is "
            f"{self.agreed}/{self.compared}, bounds [{self.lower:.3f}, {self.upper:.3f}] "
            f"against min_agreement {self.target:g}"
        )

    def as_dict(self) -> dict[str, object]:
        return {
            "old": self.old,
            "new": self.new,
            "bucket": self.bucket,
            "agreed": self.agreed,
            "compared": self.compared,
            "lower": round(self.lower, 4),
            "upper": round(self.upper, 4),
            "target": self.target,
        }


class WindowController:
    def __init__(self, max_items: int, target: float, min_sample: int, z: float) -> None:
        self.max_items = max_items
        self.window = max_items  # start at the cheapest; the sample says whether it holds
        self.target = target
        self.min_sample = min_sample
        self.z = z
        # Comparisons a perfect record needs before its lower bound reaches the target;
        # twice that many with a lower bound still under it: the window had its chance
        # to prove itself and did not (a sample that small is not yet a verdict).
        self.proof = max(min_sample, math.ceil(z * z * target / max(1e-9, 1 - target)))
        self.memory: deque[tuple[str, bool]] = deque(maxlen=10 * self.proof)
        self.fresh = 0  # comparisons at the current window's bucket since the last change

    def resize(self, max_items: int) -> None:
        """A new `window.max_items` (a reconfigured spec)."""
        self.max_items = max_items
        self.window = min(self.window, max_items)

    def stats(self, bucket: str) -> tuple[int, int]:
        """(agreed, compared) among the remembered comparisons of `bucket`."""
        seen = [ok for b, ok in self.memory if b == bucket]
        return sum(seen), len(seen)

    def _bad(self, bucket: str) -> bool:
        agreed, n = self.stats(bucket)
        if n < self.min_sample:
            return False
        lower, upper = wilson(agreed, n, self.z)
        return upper < self.target or (n >= 2 * self.proof and lower < self.target)

    def observe(self, size: int, agreed: bool) -> Change | None:
        """One comparison of an answer given at window `size`; the change it caused."""
        bucket = bucket_of(size)
        self.memory.append((bucket, agreed))
        current = bucket_of(self.window)
        if bucket != current:
            return None
        self.fresh += 1
        ok, n = self.stats(current)
        lower, upper = wilson(ok, n, self.z)
        if self._bad(current) and self.window > 1:
            return self._change(max(1, self.window // 2), current, ok, n, lower, upper)
        if self.fresh >= self.min_sample and n >= self.min_sample and lower >= self.target:
            grown = min(self.max_items, self.window + max(1, self.window // 4))
            if grown > self.window and not self._bad(bucket_of(grown)):
                return self._change(grown, current, ok, n, lower, upper)
        return None

    def _change(self, new: int, bucket: str, ok: int, n: int, lower: float, upper: float) -> Change:
        change = Change(self.window, new, bucket, ok, n, lower, upper, self.target)
        self.window = new
        self.fresh = 0
        return change
