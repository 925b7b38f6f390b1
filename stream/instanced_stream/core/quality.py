"""The spec's `quality` section: how much of the stream is also asked alone (the shadow
sample), the agreement the window must keep, and which items get a second opinion; plus
the statistics both the controller and dashboards read agreement with.

Agreement is a share measured on a sample, so it is judged by its Wilson score interval:
a window holds when the interval's lower bound is at or above `min_agreement`, and is
shrunk when the sample shows it is below (its upper bound under the target, or a sample
large enough to have proven it and a lower bound still under).
"""

from __future__ import annotations

import math
from statistics import NormalDist
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["Quality", "bucket_of", "wilson", "z_of"]


class Quality(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    shadow_rate: float = Field(
        0.0,
        ge=0,
        le=1,
        description="Share of items also asked alone (window 1) in the background, to "
        "measure the batched decisions' agreement with lone ones; shadow answers never "
        "publish anything, their requests, tokens and cost are counted",
    )
    min_agreement: float | None = Field(
        None,
        ge=0,
        le=0.99,
        description="Set: the window follows agreement, the largest whose lower confidence "
        "bound stays at or above this (within window.max_items); needs shadow_rate > 0",
    )
    min_sample: int = Field(
        20, ge=1, description="Shadow comparisons at a window size before it is judged"
    )
    confidence: float = Field(
        0.95, gt=0.5, lt=1, description="Two-sided confidence of the agreement's bounds"
    )
    escalate_on: Literal["divergence", "reask", "never"] = Field(
        "never",
        description="Which instances get a second opinion before publishing: divergence "
        "(its advisors diverged past advice.divergence_alert), reask (it was asked more "
        "than once), never; asked alone, of model.escalate where set",
    )


def z_of(confidence: float) -> float:
    """The normal quantile of a two-sided `confidence` (0.95: 1.96)."""
    return NormalDist().inv_cdf(0.5 + confidence / 2)


def wilson(agreed: int, n: int, z: float) -> tuple[float, float]:
    """The Wilson score interval of `agreed` out of `n` (0, 1 when n is 0)."""
    if n <= 0:
        return 0.0, 1.0
    p = agreed / n
    z2 = z * z
    centre = p + z2 / (2 * n)
    spread = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n))
    scale = 1 + z2 / n
    return max(0.0, (centre - spread) / scale), min(1.0, (centre + spread) / scale)


def bucket_of(size: int) -> str:
    """A window size's bucket (powers of two: 1, 2-3, 4-7, ...), the metric's label."""
    if size <= 1:
        return "1"
    low = 1 << (size.bit_length() - 1)
    return f"{low}-{2 * low - 1}"
