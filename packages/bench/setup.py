"""instanced-stream-bench's packages. The broker's pom.xml lives in a folder of its own: a
data-only package, listed so that setuptools ships it without warning that an importable
folder is left out. The same for the schema registry's build (testing/schema_registry.py):
a pom and its sources in Maven's layout (src/main/java/..., src/main/resources), copied as
they are into the build folder. Each folder of that layout is listed too, as a data-only
package: setuptools takes a folder without a dot in its name for a package, and warns of one
left out."""

from setuptools import find_namespace_packages, find_packages, setup

PACKAGE = "instanced_stream_bench"
BROKER_POM = f"{PACKAGE}.testing.kafka"
REGISTRY_APP = f"{PACKAGE}.testing.apicurio"
REGISTRY_TREE = find_namespace_packages(where="src", include=[f"{REGISTRY_APP}.src.*"])

setup(
    packages=[
        *find_packages(where="src", include=[PACKAGE, f"{PACKAGE}.*"]),
        BROKER_POM,
        REGISTRY_APP,
        *REGISTRY_TREE,
    ],
    package_dir={"": "src"},
    package_data={
        PACKAGE: ["py.typed"],
        BROKER_POM: ["pom.xml"],
        REGISTRY_APP: ["pom.xml"],
        **{name: ["*"] for name in REGISTRY_TREE},
    },
)
