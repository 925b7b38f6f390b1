"""The metrics of the input partitions assigned to this process: their lag, their unit's
state (open, restoring, failing), the units that failed (runtime/units/opening.py), and
the workflow states their stores hold: in memory, or finished and on the changelog only."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge

__all__ = ["PartitionMetrics"]

_P = "instanced_stream_"  # every series of the product starts with it (see metrics.py)


class PartitionMetrics:
    """The assigned input partitions: their lag, their unit's state, the units that failed."""

    def __init__(self, r: CollectorRegistry) -> None:
        self.lag = Gauge(f"{_P}consumer_lag", "Records not yet consumed", ["partition"], registry=r)
        self._lagging: set[int] = set()
        self.lag_total = 0  # over the partitions assigned here, for the live page
        self.states = Gauge(
            f"{_P}partitions",
            "Input partitions assigned here, by their unit's state (open, restoring, failing)",
            ["state"],
            registry=r,
        )
        self.failures = Counter(
            f"{_P}partition_failures",
            "Units that failed to open or failed while open (each is opened again after a"
            " back-off)",
            ["partition"],
            registry=r,
        )

        self.workflows = Gauge(
            f"{_P}workflow_states",
            "Workflow states held here: live (in memory) or retired (finished; only where"
            " their changelog record is, and when they ended)",
            ["held"],
            registry=r,
        )
        self.recalls = Counter(
            f"{_P}states_recalled",
            "Finished states read back from the changelog (a repeated answer or a new input"
            " of their instance)",
            registry=r,
        )
        self.held = {"live": 0, "retired": 0, "recalled": 0}  # for the live page
        # The group's health as this member sees it. Summed over members, `partitions`
        # {state="open"} against `input_partitions` is what no member serves (the
        # PartitionsUnowned alert): only the group as a whole knows, so it is a query.
        self.stable = Gauge(
            f"{_P}group_stable",
            "1 while this member holds an assignment and no rebalance is under way",
            registry=r,
        )
        self.rebalances_last_min = Gauge(
            f"{_P}rebalances_last_minute",
            "Rebalances of the group that began in the last 60 s",
            registry=r,
        )
        self.input_partitions = Gauge(
            f"{_P}input_partitions",
            "Partitions of the input topic (the group's to serve)",
            registry=r,
        )

    def set_group(self, group: Mapping[str, Any], input_partitions: int) -> None:
        """This member's place in its group (`Membership.group`)."""
        self.stable.set(1 if group["stable"] else 0)
        self.rebalances_last_min.set(group["rebalances_last_min"])
        self.input_partitions.set(input_partitions)

    def set_held(self, live: int, retired: int, recalled: int) -> None:
        """The stores' figures now (`Stores.held`)."""
        self.recalls.inc(max(0, recalled - self.held["recalled"]))
        self.held = {"live": live, "retired": retired, "recalled": recalled}
        self.workflows.labels("live").set(live)
        self.workflows.labels("retired").set(retired)

    def failed(self, partition: int) -> None:
        self.failures.labels(str(partition)).inc()

    def set_lag(self, lags: Mapping[int, int]) -> None:
        """Lag of the partitions assigned now; a revoked partition's series is removed, so
        no stale figure stays behind for the new owner's to double."""
        for gone in self._lagging - lags.keys():
            self.lag.remove(str(gone))
        for partition, lag in lags.items():
            self.lag.labels(str(partition)).set(lag)
        self._lagging = set(lags)
        self.lag_total = sum(lags.values())

    def set(self, states: Mapping[int, Mapping[str, Any]]) -> None:
        """Each assigned partition's unit state (`Membership.states`)."""
        for state in ("open", "restoring", "failing"):
            self.states.labels(state).set(sum(1 for v in states.values() if v["state"] == state))
