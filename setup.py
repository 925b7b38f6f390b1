"""Packaging beyond what pyproject.toml can say. The source root is `stream/` (the src
layout: `stream/instanced_stream/`, so tests and tools import the installed package, never
the working tree). The examples live at the top of the repository (people run `stream check
--spec examples/...` from a checkout) and ship inside the wheel as
`instanced_stream.examples`, so a non-editable install finds the default spec and the demo's
examples without a source tree."""

from setuptools import find_namespace_packages, find_packages, setup

EXAMPLES = [
    f"instanced_stream.{name}" for name in find_packages(include=["examples", "examples.*"])
]

# The broker's pom.xml lives in a folder of its own: a data-only package, listed so that
# setuptools ships it without warning that an importable folder is left out.
BROKER_POM = "instanced_stream.testing.kafka"
# The same for the schema registry's build (testing/schema_registry.py): a pom and its sources
# in Maven's layout (src/main/java/..., src/main/resources), copied as they are into the
# build folder. Each folder of that layout is listed too, as a data-only package: setuptools
# takes a folder without a dot in its name for a package, and warns of one left out.
REGISTRY_APP = "instanced_stream.testing.apicurio"
REGISTRY_TREE = find_namespace_packages(where="stream", include=[f"{REGISTRY_APP}.src.*"])

setup(
    packages=[
        *find_packages(where="stream", include=["instanced_stream", "instanced_stream.*"]),
        BROKER_POM,
        REGISTRY_APP,
        *REGISTRY_TREE,
        *EXAMPLES,
    ],
    package_dir={"": "stream", "instanced_stream.examples": "examples"},
    package_data={
        "instanced_stream": ["py.typed", "observe/live.html"],
        BROKER_POM: ["pom.xml"],
        REGISTRY_APP: ["pom.xml"],
        **{name: ["*"] for name in REGISTRY_TREE},
        **{name: ["*.yaml", "*.jsonl"] for name in EXAMPLES},
    },
)
