"""The benchmark and demo harness: the product run on a broker, a model and processors it
starts itself, to show it or to measure it; nothing here is run against a deployment
(that is `ops`, the floor below, which the harness may import and which never imports
it). What each run talks to: `target` (the simulator, a local model or an endpoint).

- the demo: `demo` (processor processes, producing, waiting until accounted), `chaos`
  (kills during it), `seeds` (the seeds' own examples);
- the bench: `bench`, `duplicates`, `load` (items, pacing, the tally), `report` and
  `figures` (its results, table and plots), `soak` (memory over a long run);
- rebalances at size (`stream bench --churn`): `churn`, `fleet` (the processes),
  `timeline`, `rebalances`, `outcomes`, `moves`, `changelog_states`;
- the restart storm (`--restarts`): `storm`, `kills`, `coordinator`, `owners`,
  `progress`;
- decisions measured without Kafka: `eval` (window sizes), `injection` (one item's text
  changing another's decision).

What runs beside a measured run while `async with` holds it: `background`.

Modules are imported where used."""

__all__ = [
    "background",
    "bench",
    "changelog_states",
    "chaos",
    "churn",
    "coordinator",
    "demo",
    "duplicates",
    "eval",
    "figures",
    "fleet",
    "injection",
    "kills",
    "load",
    "moves",
    "outcomes",
    "owners",
    "progress",
    "rebalances",
    "report",
    "seeds",
    "soak",
    "storm",
    "target",
    "timeline",
]
