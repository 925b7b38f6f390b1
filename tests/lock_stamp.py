"""The stamp `./dev lock` writes at the top of constraints.txt: a digest of what
pyproject.toml declares (dependencies and every extra), so tests/unit/test_lock.py can tell
offline that the pins were resolved from today's declarations. Standard library only: it
runs before anything else is installed."""

from __future__ import annotations

import hashlib
import json
import tomllib
from pathlib import Path

__all__ = ["stamp"]

ROOT = Path(__file__).resolve().parents[1]


def stamp(pyproject: Path = ROOT / "pyproject.toml") -> str:
    project = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]
    declared = {
        "requires-python": project.get("requires-python"),
        "dependencies": sorted(project.get("dependencies", [])),
        "optional-dependencies": {
            name: sorted(deps) for name, deps in project.get("optional-dependencies", {}).items()
        },
    }
    digest = hashlib.sha256(json.dumps(declared, sort_keys=True).encode()).hexdigest()
    return f"pyproject.toml dependencies sha256: {digest}"


if __name__ == "__main__":
    print(stamp())
