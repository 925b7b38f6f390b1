"""instanced-stream: batched, multi-instance LLM decisions on a Kafka stream.

Floors, each importing only from those below it (tests/unit/test_layout.py checks it):

- base modules: `errors`, `retry`, `settings`, `faultpoints` (the pipeline's named moments),
  `termination` (SIGTERM, recorded while a command starts).
- `core`: the protocols (spec, messages, prompt, validation, solving, advice, workflow,
  state). Pure: no Kafka, no HTTP.
- `observe` (metrics, traces, the probes' and live page's server, logs) and `kafka`
  (clients, security, topics, the producer, trace headers).
- `llm` (the model endpoint through the openai client, its limiter, a local server) and
  `activities` (the SDK for workers that run activity calls).
- `runtime`: the processor: the pipeline, quality control, the units (the exactly-once
  kernel) and their state, the Batch API tier, and the service that assembles them.
- `ops`: the operator's commands: audit, redrive, approvals, console, tail, check, schemas.
- `cli`: the `stream` command.
"""

from __future__ import annotations

__all__ = ["__version__"]


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    # The product, or the activity workers' thin distribution (packages/activities).
    for name in ("instanced-stream", "instanced-stream-activities"):
        try:
            return version(name)
        except PackageNotFoundError:
            continue
    return "0+unknown"  # a source tree that was never installed


def __getattr__(name: str) -> str:
    # Looked up when asked, not at import: importlib.metadata is most of what importing
    # the package costs, and every `stream` start imports it before it can catch SIGTERM
    # (cli/entry.py).
    if name == "__version__":
        return _version()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
