"""instanced-stream-activities: the activity worker alone, as its own import package.

Its modules are the product's own source (../../stream/instanced_stream), copied when the source
distribution is made into `src/instanced_stream_worker`, with every `instanced_stream`
module name in them renamed. So this distribution never owns a file that instanced-stream
owns, and both can be installed side by side; the copy is taken from the modules the
worker and its command import (followed from their module-level imports), nothing more.
A wheel built from the source distribution uses the copy it carries.
"""

from __future__ import annotations

import ast
import re
import shutil
from pathlib import Path

from setuptools import find_packages, setup

HERE = Path(__file__).resolve().parent
PRODUCT = "instanced_stream"
PACKAGE = "instanced_stream_worker"
SOURCE = HERE.parent.parent / "stream" / PRODUCT
OUT = HERE / "src"
# What a worker runs: the SDK and the `stream` command that starts it.
ENTRIES = tuple(f"{PRODUCT}.{m}" for m in ("activities.worker", "cli.activities", "observe.logs"))


def _file(module: str) -> Path | None:
    parts = module.split(".")[1:]
    for path in (
        SOURCE.joinpath(*parts, "__init__.py"),
        SOURCE.joinpath(*parts).with_suffix(".py"),
    ):
        if path.is_file():
            return path
    return None


def _imports(module: str) -> set[str]:
    """The product modules `module` imports at module level (not under TYPE_CHECKING, not
    inside functions: those run only in commands the worker does not have)."""
    path = _file(module)
    assert path is not None, module
    found: set[str] = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith(PRODUCT)}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(PRODUCT):
            found.add(node.module)
            # `from instanced_stream.kafka import clients` imports a module too
            found |= {
                f"{node.module}.{a.name}" for a in node.names if _file(f"{node.module}.{a.name}")
            }
    return {m for m in found if _file(m)}


def closure() -> set[str]:
    todo, seen = list(ENTRIES), set()
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        parts = module.split(".")
        todo += [".".join(parts[:i]) for i in range(1, len(parts))]  # its packages
        todo += sorted(_imports(module))
    return seen


def generate() -> None:
    target = OUT / PACKAGE
    shutil.rmtree(target, ignore_errors=True)
    rename = re.compile(rf"\b{PRODUCT}\b")
    for module in sorted(closure()):
        source = _file(module)
        assert source is not None
        dest = target.joinpath(*module.split(".")[1:])
        dest = dest / "__init__.py" if source.name == "__init__.py" else dest.with_suffix(".py")
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text(rename.sub(PACKAGE, source.read_text(encoding="utf-8")), encoding="utf-8")
    (target / "py.typed").write_text("")


if SOURCE.is_dir():  # in the repository; from an unpacked sdist the copy is already there
    generate()

setup(
    packages=find_packages(str(OUT)),
    package_dir={"": "src"},
    package_data={PACKAGE: ["py.typed"]},
)
