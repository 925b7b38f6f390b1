"""The suite's xdist groups (`./dev test` runs `-n 4 --dist loadgroup`), kept apart from
tests/conftest.py so tests/unit/test_xdist_groups.py can load them without a broker's
imports."""

from __future__ import annotations

import pytest

__all__ = ["pytest_collection_modifyitems"]


# tryfirst: xdist's own hook turns the xdist_group marks into node ids, so they must be
# on the items before it runs (tests/unit/test_xdist_groups.py pins it).
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """`./dev test` runs on four xdist workers (`--dist loadgroup`): most tests wait on a
    broker or a model, so four keep the two cores busy. The tests that load the machine
    keep to a worker each, one at a time: the real model's (llama.cpp takes both cores
    while it answers) on one, the fault campaigns' kills and rebalances on another, so two
    models or two campaigns never share the cores and a heartbeat or an answer is never
    starved by a second one; the light tests run beside them. The install tests build in
    one source tree: one worker."""
    for item in items:
        if item.get_closest_marker("local_model"):
            item.add_marker(pytest.mark.xdist_group("model"))
        elif item.get_closest_marker("slow"):
            item.add_marker(pytest.mark.xdist_group("faults"))
        elif item.path.name == "test_install.py":
            item.add_marker(pytest.mark.xdist_group("install"))
