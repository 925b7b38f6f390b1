"""Packaging beyond what pyproject.toml can say. The source root is `stream/` (the src
layout: `stream/instanced_stream/`, so tests and tools import the installed package, never
the working tree). The examples live at the top of the repository (people run `stream check
--spec examples/...` from a checkout) and ship inside the wheel as
`instanced_stream.examples`, so a non-editable install finds the default spec and the demo's
examples without a source tree. The team's own bench (the demo, the benchmarks, the test
support) is a distribution of its own: packages/bench."""

from setuptools import find_packages, setup

EXAMPLES = [
    f"instanced_stream.{name}" for name in find_packages(include=["examples", "examples.*"])
]

setup(
    packages=[
        *find_packages(where="stream", include=["instanced_stream", "instanced_stream.*"]),
        *EXAMPLES,
    ],
    package_dir={"": "stream", "instanced_stream.examples": "examples"},
    package_data={
        "instanced_stream": ["py.typed", "observe/live.html"],
        **{name: ["*.yaml", "*.jsonl"] for name in EXAMPLES},
    },
)
