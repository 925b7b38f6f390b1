"""Packaging beyond what pyproject.toml can say: the examples live at the top of the
repository (people run `stream check --spec examples/...` from a checkout) and ship
inside the wheel as `stream.examples`, so a non-editable install finds the default spec
and the demo's examples without a source tree."""

from setuptools import find_packages, setup

EXAMPLES = [f"stream.{name}" for name in find_packages(include=["examples", "examples.*"])]

setup(
    packages=[*find_packages(include=["stream", "stream.*"]), *EXAMPLES],
    package_dir={"stream.examples": "examples"},
    package_data={
        "stream": ["py.typed", "testing/kafka/pom.xml", "ops/live.html"],
        **{name: ["*.yaml", "*.jsonl"] for name in EXAMPLES},
    },
)
