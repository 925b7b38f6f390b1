"""The operator's commands, for a deployment's topics, spec and settings: is every
item accounted for (`audit`, and `workflow_audit` for stateful workflows), send dead-lettered
items back (`redrive`), approve a lazy plan's proposals (`approvals`), publish a JSONL file
and list or create the topics (`console`), read a topic's last records (`tail`), lint the
spec and settings and ask the endpoint and brokers (`check`, the spec's own lint in
`spec_lint`), and write the contracts
(`schemas`, `asyncapi`). Nothing here starts a broker, a simulator or a processor: that is
`harness`, the floor above, which may import these and never the reverse. Modules are
imported where used."""

__all__ = [
    "approvals",
    "asyncapi",
    "audit",
    "check",
    "console",
    "redrive",
    "schemas",
    "spec_lint",
    "tail",
    "workflow_audit",
]
