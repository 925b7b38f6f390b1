"""Tools built on the product, for people: `demo`, `bench`, `soak`, `load`, `eval`,
`churn` (rebalances at size, with `fleet`, `timeline`, `rebalances`, `outcomes`, `moves`
and `changelog_states`),
`chaos`, `injection`, `seeds` (the seeds' examples), `report`/`figures` (their output),
`target` (what they run against). The operator's commands are the floor below (`ops`).
Modules are imported where used."""

__all__ = [
    "bench",
    "changelog_states",
    "chaos",
    "churn",
    "demo",
    "eval",
    "figures",
    "fleet",
    "injection",
    "load",
    "moves",
    "outcomes",
    "rebalances",
    "report",
    "seeds",
    "soak",
    "target",
    "timeline",
]
