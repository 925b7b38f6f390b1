"""instanced-stream-bench: the team's own bench, a distribution of its own beside the product
(as Kafka Streams ships its test utilities apart): the demo and the benchmarks (`harness`),
the test support (`testing`: the LLM simulator, the Kafka broker and cluster launchers, the
schema registry's build, the fault injector, a real local model's server), and the
`stream` commands that run them (`cli`, `commands`). It imports the product; the product
never imports it (tests/unit/test_layout.py)."""

__all__ = ["cli", "commands", "harness", "testing"]
