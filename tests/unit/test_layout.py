"""The package layout keeps its promises: a pure core, an SDK without mode, and modules
and classes small enough to read."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
STREAM = ROOT / "instanced_stream"
MAX_MODULE_LINES = 450
MAX_CLASS_LINES = 250


def _loaded_after(code: str, heavy: tuple[str, ...]) -> list[str]:
    probe = f"{code}\nimport sys\nprint(' '.join(m for m in {heavy!r} if m in sys.modules))"
    done = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        cwd=ROOT,
    )
    return done.stdout.split()


def test_the_core_imports_no_kafka_http_or_model_client() -> None:
    code = (
        "import importlib, pkgutil, instanced_stream.core\n"
        "for m in pkgutil.iter_modules(instanced_stream.core.__path__):\n"
        "    importlib.import_module('instanced_stream.core.' + m.name)"
    )
    assert _loaded_after(code, ("mode", "aiokafka", "aiohttp", "openai")) == []


def test_the_activity_sdk_imports_no_service_framework() -> None:
    assert _loaded_after("import instanced_stream.activities", ("mode",)) == []


def _sizes() -> dict[str, tuple[int, dict[str, int]]]:
    """Module (relative path) -> (its lines, its classes' lines by name)."""
    out = {}
    for path in sorted(STREAM.rglob("*.py")):
        text = path.read_text()
        classes = {
            node.name: (node.end_lineno or node.lineno) - node.lineno + 1
            for node in ast.walk(ast.parse(text))
            if isinstance(node, ast.ClassDef)
        }
        out[str(path.relative_to(ROOT))] = (len(text.splitlines()), classes)
    return out


def _over(lines: int, classes: dict[str, int]) -> list[str]:
    found = [f"{lines} lines"] if lines > MAX_MODULE_LINES else []
    return found + [f"class {c}: {n} lines" for c, n in classes.items() if n > MAX_CLASS_LINES]


def test_no_module_or_class_is_too_long() -> None:
    too_long = {
        module: over
        for module, (lines, classes) in _sizes().items()
        if (over := _over(lines, classes))
    }
    assert not too_long, (MAX_MODULE_LINES, MAX_CLASS_LINES, too_long)
