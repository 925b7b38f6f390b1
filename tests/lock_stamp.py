"""The stamp `./dev lock` writes at the top of constraints.txt: a digest of what the two
distributions built from this repository declare (the product's pyproject.toml and the
bench's packages/bench/pyproject.toml: dependencies and every extra), so
tests/unit/test_lock.py can tell offline that the pins were resolved from today's
declarations. `python tests/lock_stamp.py --bench-requirements` prints the bench's own
third-party requirements for `./dev lock` (its dependency on the product is the checkout
itself, not something to resolve). Standard library only: it runs before anything else is
installed."""

from __future__ import annotations

import hashlib
import json
import re
import sys
import tomllib
from pathlib import Path
from typing import Any

__all__ = ["PRODUCT", "PYPROJECTS", "bench_requirements", "declared", "stamp"]

ROOT = Path(__file__).resolve().parents[1]
PYPROJECTS = (ROOT / "pyproject.toml", ROOT / "packages" / "bench" / "pyproject.toml")
PRODUCT = "instanced-stream"


def _project(pyproject: Path) -> dict[str, Any]:
    project: dict[str, Any] = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]
    return project


def declared(pyproject: Path) -> list[str]:
    """Every requirement `pyproject` declares, extras included, but the product itself."""
    project = _project(pyproject)
    extras = project.get("optional-dependencies", {}).values()
    every = [*project.get("dependencies", []), *(d for e in extras for d in e)]
    return [d for d in every if re.split(r"[\s\[<>=!~;]", d, maxsplit=1)[0] != PRODUCT]


def bench_requirements() -> list[str]:
    return declared(PYPROJECTS[1])


def stamp(pyprojects: tuple[Path, ...] = PYPROJECTS) -> str:
    digests = []
    for pyproject in pyprojects:
        project = _project(pyproject)
        declared_here = {
            "requires-python": project.get("requires-python"),
            "dependencies": sorted(project.get("dependencies", [])),
            "optional-dependencies": {
                name: sorted(deps)
                for name, deps in project.get("optional-dependencies", {}).items()
            },
        }
        digests.append(declared_here)
    digest = hashlib.sha256(json.dumps(digests, sort_keys=True).encode()).hexdigest()
    return f"pyproject.toml and packages/bench dependencies sha256: {digest}"


if __name__ == "__main__":
    if sys.argv[1:] == ["--bench-requirements"]:
        print("\n".join(bench_requirements()))
    else:
        print(stamp())
