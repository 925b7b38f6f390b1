"""The statistics the window controller and the dashboards read agreement with: the
normal quantile of a confidence, the Wilson score interval of a sample, and the window
size buckets (powers of two) the metric is labelled by."""

from __future__ import annotations

import pytest
from instanced_stream.core.quality import bucket_of, wilson, z_of

Z = z_of(0.95)


def test_wilson_bounds_and_buckets() -> None:
    assert pytest.approx(1.96, abs=0.001) == Z
    lower, upper = wilson(10, 10, Z)
    assert upper == 1.0 and lower == pytest.approx(10 / (10 + Z * Z))
    lower, upper = wilson(50, 100, Z)
    assert lower == pytest.approx(0.404, abs=0.001) and upper == pytest.approx(0.596, abs=0.001)
    assert wilson(0, 0, Z) == (0.0, 1.0)
    assert [bucket_of(n) for n in (1, 2, 3, 4, 7, 8, 25, 500)] == [
        "1", "2-3", "2-3", "4-7", "4-7", "8-15", "16-31", "256-511"
    ]  # fmt: skip
