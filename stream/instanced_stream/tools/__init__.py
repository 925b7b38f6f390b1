"""Tools built on the product, for people: `demo`, `bench`, `soak`, `load`, `eval`,
`chaos`, `injection`, `seeds` (the seeds' examples), `report`/`figures` (their output),
`target` (what they run against), and the operator's tools: `audit`,
`workflow_audit`, `approvals`, `console` (produce, tail, topics), `check`, `schemas`
and `asyncapi`. Modules are imported where used."""

__all__ = [
    "approvals",
    "asyncapi",
    "audit",
    "bench",
    "chaos",
    "check",
    "console",
    "demo",
    "eval",
    "figures",
    "injection",
    "load",
    "report",
    "schemas",
    "seeds",
    "soak",
    "target",
    "workflow_audit",
]
