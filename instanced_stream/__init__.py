"""instanced-stream: batched, multi-instance LLM decisions on a Kafka stream.

The sub-packages follow the data path (see docs/architecture.md):

- `instanced_stream.core`: the protocols (spec, messages, prompt, validation, solving, advice,
  workflow, state). Pure: no Kafka, no HTTP.
- `instanced_stream.llm`: the model endpoint (openai client), its adaptive limiter, a local server.
- `instanced_stream.runtime`: the Kafka side: units, state stores, windows, commits.
- `instanced_stream.activities`: the SDK for workers that run activity calls (no faust needed).
- `instanced_stream.ops`: what people run and watch: CLI, console, audit, metrics, web page, logs.
- `instanced_stream.testing`: the LLM simulator, the local broker launcher, samples,
  fault injection.
- `instanced_stream.tools`: demo, benchmark, soak and eval, built on the parts above.
"""

from importlib.metadata import PackageNotFoundError, version


def _version() -> str:
    # The product, or the activity workers' thin distribution (packages/activities).
    for name in ("instanced-stream", "instanced-stream-activities"):
        try:
            return version(name)
        except PackageNotFoundError:
            continue
    return "0+unknown"  # a source tree that was never installed


__version__ = _version()

__all__ = ["__version__"]
