"""packages/activities: the activity-worker distribution. What the worker and the CLI
import must come from its declared dependencies (and theirs), and never from the
processor's heavy ones."""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[3]
THIN = ROOT / "packages" / "activities" / "pyproject.toml"
FORBIDDEN = {
    "faust-streaming",
    "openai",
    "tiktoken",
    "scikit-learn",
    "matplotlib",
    "mode-streaming",
}

_PROBE = """
import sys
before = set(sys.modules)
import instanced_stream.activities.worker, instanced_stream.cli.activities
import instanced_stream.observe.logs
names = {m.split('.')[0] for m in set(sys.modules) - before}
print(' '.join(sorted(names - set(sys.stdlib_module_names) - {'instanced_stream'})))
"""


def _canon(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _closure(names: set[str]) -> set[str]:
    """The distributions `names` pull in, following installed metadata (no extras)."""
    todo, seen = list(names), set()
    while todo:
        name = _canon(todo.pop())
        if name in seen:
            continue
        seen.add(name)
        for spec in importlib.metadata.requires(name) or []:
            req = Requirement(spec)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return seen


def _imported_distributions() -> set[str]:
    out = subprocess.run(
        [sys.executable, "-c", _PROBE], capture_output=True, text=True, check=True, cwd=ROOT
    ).stdout.split()
    owners = importlib.metadata.packages_distributions()
    found = set()
    for module in out:
        if module in owners:
            found |= {_canon(d) for d in owners[module]}
    return found


def test_the_worker_needs_only_the_thin_dependencies() -> None:
    project = tomllib.loads(THIN.read_text())["project"]
    declared = {Requirement(d).name for d in project["dependencies"]}
    allowed = _closure(declared)
    imported = _imported_distributions()
    assert "aiokafka" in imported and "pydantic" in imported  # the probe saw the imports
    missing = imported - allowed
    assert not missing, f"the worker imports {sorted(missing)}: declare them in {THIN}"
    assert not (allowed & {_canon(f) for f in FORBIDDEN}), sorted(allowed & FORBIDDEN)


def test_thin_dependencies_are_the_products_own() -> None:
    """Same version floors as the product, so one does not drift from the other."""
    product = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    thin = tomllib.loads(THIN.read_text())["project"]
    ours = {Requirement(d).name: str(Requirement(d).specifier) for d in product["dependencies"]}
    for spec in thin["dependencies"]:
        req = Requirement(spec)
        assert ours.get(req.name) == str(req.specifier), spec
    assert thin["version"] == product["version"]
