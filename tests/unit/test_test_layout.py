"""The tests mirror the packages: every module under stream/instanced_stream, and under the
bench's packages/bench/src/instanced_stream_bench (its rooms `harness/` and `testing/`
sit beside the product's in tests/unit), has a test file named after it in its room
(tests/unit/<room>/test_<module>.py, or
tests/integration/test_<module>.py for a behaviour tested across modules), or a row in
docs/testing.md's table that says why it has none. A package's own test is named for the
package, one room up. Integration tests are not filed by room, so one counts for a module
only when it imports it (a package: it or anything in it): a name alone matched
testing/sim/routing.py to tests/integration/test_routing.py, which tests partition
forwarding."""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "stream" / "instanced_stream"
BENCH = ROOT / "packages" / "bench" / "src" / "instanced_stream_bench"
# Each package's modules are named by their path in it; no path is in both.
PACKAGES = {"instanced_stream": PACKAGE, "instanced_stream_bench": BENCH}
UNIT = ROOT / "tests" / "unit"
INTEGRATION = ROOT / "tests" / "integration"
TESTING_DOC = ROOT / "docs" / "testing.md"
ROW = re.compile(r"^\| `(?P<module>[\w./]+\.py)` \| (?P<reason>.*?) \|$", re.M)


@cache
def _owners() -> dict[str, str]:
    """A module's path in its package -> that package's import name."""
    found: dict[str, str] = {}
    for name, root in PACKAGES.items():
        for path in root.rglob("*.py"):
            module = str(path.relative_to(root))
            if module != "__init__.py":
                assert module not in found, f"{module} is in both packages"
            found[module] = name
    return found


def _modules() -> list[str]:
    return sorted(_owners())


def _named_tests(module: str) -> list[Path]:
    """The test files named after `module` (a path under stream/instanced_stream) in its
    room: the unit test in the module's own folder, an integration test that imports it."""
    path = Path(module)
    if path.name == "__init__.py":
        if path.parent == Path("."):
            return []  # the package itself: no room above it
        room, name = path.parent.parent, path.parent.name
    else:
        room, name = path.parent, path.stem
    dotted = ".".join((_owners()[module], *room.parts, name))
    found = [c for c in [UNIT / room / f"test_{name}.py"] if c.exists()]
    integration = INTEGRATION / f"test_{name}.py"
    if integration.exists() and _imports(integration, dotted, path.name == "__init__.py"):
        found.append(integration)
    return found


@cache
def _imported(test: Path) -> frozenset[str]:
    """The modules `test` imports, wherever in it (`from a import b` names a and a.b)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(test.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return frozenset(names)


def _imports(test: Path, dotted: str, package: bool) -> bool:
    imported = _imported(test)
    return dotted in imported or (package and any(n.startswith(f"{dotted}.") for n in imported))


def _listed() -> dict[str, str]:
    return {m["module"]: m["reason"].strip() for m in ROW.finditer(TESTING_DOC.read_text())}


def test_every_module_has_a_test_named_after_it_or_a_reason_in_the_docs() -> None:
    listed = _listed()
    missing = [m for m in _modules() if not _named_tests(m) and m not in listed]
    assert not missing, (
        "no test file named after these modules (tests/unit/<room>/test_<module>.py, or "
        "tests/integration/test_<module>.py importing the module) and no row in "
        f"docs/testing.md: {missing}"
    )


def test_the_docs_table_lists_only_modules_without_a_named_test() -> None:
    modules = set(_modules())
    listed = _listed()
    assert listed, "docs/testing.md lost its table of modules without a named test"
    gone = sorted(set(listed) - modules)
    assert not gone, f"docs/testing.md lists modules that do not exist: {gone}"
    tested = sorted(m for m in listed if _named_tests(m))
    assert not tested, f"these have a test named after them now; drop their rows: {tested}"
    empty = sorted(m for m, reason in listed.items() if not reason)
    assert not empty, f"rows without a reason: {empty}"


def test_unit_test_folders_mirror_the_package() -> None:
    """Every folder under tests/unit is a room of the package, and a package (an
    `__init__.py`), so two test files of one name in different rooms do not collide."""
    for folder in sorted(p for p in UNIT.rglob("*") if p.is_dir() and p.name != "__pycache__"):
        rel = folder.relative_to(UNIT)
        rooms = [root / rel / "__init__.py" for root in PACKAGES.values()]
        assert any(r.exists() for r in rooms), f"tests/unit/{rel} mirrors no room"
        assert (folder / "__init__.py").exists(), f"tests/unit/{rel} has no __init__.py"
