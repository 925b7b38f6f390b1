"""The product uses its libraries through their public API only (issue 24): no private
attribute or method of aiokafka or any other library (or of anything but the object's
own) is read, patched or wrapped anywhere in the package."""

from __future__ import annotations

import ast
from pathlib import Path

STREAM = Path(__file__).resolve().parents[2] / "stream" / "instanced_stream"


def _private_uses(path: Path, root: Path = STREAM) -> list[str]:
    """`x._name` where x is not `self` or `cls`: someone else's private attribute."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Attribute):
            continue
        name = node.attr
        if not name.startswith("_") or (name.startswith("__") and name.endswith("__")):
            continue
        owner = node.value
        if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
            continue
        found.append(f"{path.relative_to(root)}:{node.lineno}: .{name}")
    return found


def test_no_private_attribute_of_another_object() -> None:
    modules = sorted(STREAM.rglob("*.py"))
    assert len(modules) > 100, f"the package's modules are not under {STREAM}"
    found = [use for path in modules for use in _private_uses(path)]
    assert not found, found


def test_the_check_finds_a_private_use(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        "def f(consumer):\n    self = consumer\n    return consumer._getmany, self._own\n"
    )
    assert [u.split(": ")[1] for u in _private_uses(sample, tmp_path)] == ["._getmany"]
