"""The package layout keeps its promises: floors that import only from below and never in
a circle, a pure core, an SDK without mode; and the long modules and classes are flagged
for review (a warning, never a failure: docs/architecture.md).

An import, for the floors and the circles, is every `import` and `from ... import` of a
module of `stream/instanced_stream` wherever it is written: at module level, inside a
function (it runs later, but it runs), and under `if TYPE_CHECKING:` (it never runs, but
the module still needs the other to be read, and a type that must be imported back up is
a type on the wrong floor). `from package import name` counts the package and, when `name`
is a module, that module too. Imports named in strings (`importlib`) are not seen."""

from __future__ import annotations

import ast
import subprocess
import sys
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
STREAM = ROOT / "stream" / "instanced_stream"
PACKAGE = "instanced_stream"
# A guide, not a rule of meaning: a module past it is read again to see whether it holds
# two things (then it is split where they divide), never cut at a line count.
MAX_MODULE_LINES = 450
MAX_CLASS_LINES = 250

# The floors, bottom first. A module imports its own package, or a floor below its own;
# two packages of one floor (observe and kafka; llm and activities) do not import each
# other. Inside `runtime` the sub-packages are floors of their own, in this order.
FLOORS: tuple[tuple[str, ...], ...] = (
    ("",),  # the base modules: errors, retry, settings, faultpoints, termination
    ("core",),
    ("observe", "kafka"),
    ("llm", "activities"),
    ("runtime.pipeline.windows", "runtime.pipeline.outcomes"),
    ("runtime.quality",),
    ("runtime.state",),
    ("runtime.units",),
    ("runtime.pipeline",),
    ("runtime.batch_api",),
    ("runtime.assembly",),
    ("runtime", "runtime.service"),
    ("ops",),
    ("cli",),
)
# The team's bench (packages/bench): it imports the product; nothing of the product imports it.
BENCH = "instanced_stream_bench"
# `python -m instanced_stream` is the CLI's.
ALIASES = {"__main__": "cli.main"}


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


def test_long_modules_and_classes_are_flagged_for_review() -> None:
    """A line count is a hint for review, never a reason to squeeze code onto one line
    (docs/architecture.md says what a module and a class should be): the long ones are
    flagged in the run's warnings, and the check itself must find the largest."""
    sizes = _sizes()
    too_long = {m: over for m, (lines, classes) in sizes.items() if (over := _over(lines, classes))}
    if too_long:
        warnings.warn(
            f"for review, past {MAX_MODULE_LINES} lines a module or {MAX_CLASS_LINES} a "
            f"class: {too_long}",
            stacklevel=1,
        )
    largest = max(sizes.values(), key=lambda found: found[0])[0]
    assert _over(largest, {}) == ([f"{largest} lines"] if largest > MAX_MODULE_LINES else [])
    assert largest > 100  # the walk found the package's modules


def _modules() -> dict[str, Path]:
    """Module name (without the package prefix; "" for the package) -> its file."""
    found = {}
    for path in STREAM.rglob("*.py"):
        parts = path.relative_to(STREAM).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    assert len(found) > 100, f"the package's modules are not under {STREAM}"
    return found


def _imported(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package's modules that module `name` (its file `path`) imports anywhere in it:
    at module level, in a function, under `if TYPE_CHECKING:` (the module docstring says
    why); a relative import as the module it names."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    here = [PACKAGE, *package.split(".")] if package else [PACKAGE]
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            anchor = here[: len(here) - node.level + 1] if node.level else []
            base = ".".join([*anchor, *([node.module] if node.module else [])])
            names.add(base)
            names.update(f"{base}.{a.name}" for a in node.names)
    prefix = PACKAGE + "."
    local = {n.removeprefix(prefix) if n != PACKAGE else "" for n in names}
    return {n for n in local if n in modules and (n or PACKAGE in names)}


def _graph() -> dict[str, set[str]]:
    """Module -> the package's modules it imports (every import: the module docstring)."""
    modules = _modules()
    return {name: _imported(name, path, modules) - {name} for name, path in modules.items()}


def test_the_graph_counts_every_import(tmp_path: Path) -> None:
    """Module level, in a function, under TYPE_CHECKING, relative, a module named in a
    `from package import`: each is an arrow of the graph the floors and circles read."""
    source = tmp_path / "probe.py"
    source.write_text(
        "from typing import TYPE_CHECKING\n"
        "import instanced_stream.errors\n"
        "from instanced_stream.kafka import clients\n"
        "if TYPE_CHECKING:\n"
        "    from instanced_stream.runtime.units.unit import Unit\n"
        "def later() -> None:\n"
        "    from instanced_stream.core.spec import AgentSpec\n"
        "from .records import OutRecord\n"
        "from .. import retry\n"
    )
    assert _imported("kafka.probe", source, _modules()) == {
        "errors",
        "kafka",
        "kafka.clients",
        "runtime.units.unit",
        "core.spec",
        "kafka.records",
        "",
        "retry",
    }


def _place(module: str) -> tuple[int, str]:
    """(floor, package) of a module: its longest-named package in FLOORS."""
    module = ALIASES.get(module, module)
    best = (0, "")
    for floor, packages in enumerate(FLOORS):
        for package in packages:
            inside = module == package or module.startswith(package + ".") if package else True
            if inside and len(package) >= len(best[1]):
                best = (floor, package)
    if best[1] == "" and "." in module:
        raise AssertionError(f"{module}: no floor in FLOORS holds its package")
    return best


def test_every_import_runs_downward() -> None:
    """No module imports from a floor above its own, nor from another package of its
    floor, whatever kind of import (the module docstring)."""
    upward = []
    for module, imported in sorted(_graph().items()):
        floor, package = _place(module)
        for target in sorted(imported):
            their_floor, their_package = _place(target)
            same_package = their_package == package
            if their_floor > floor or (their_floor == floor and not same_package):
                upward.append(f"{module} (floor {floor}) imports {target} (floor {their_floor})")
    assert not upward, "imports that run upward or across a floor:\n" + "\n".join(upward)


def test_no_import_circle() -> None:
    """No module of the package reaches itself again by following imports, whatever kind
    (the module docstring): not a TYPE_CHECKING import back, nor a function's. A circle is
    a type on the wrong floor: it moves down to a module both can import."""
    graph = _graph()
    state: dict[str, int] = {}  # 1 on the path, 2 done
    circles: list[list[str]] = []

    def walk(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                circles.append([*path[path.index(nxt) :], nxt])
            elif nxt not in state:
                walk(nxt, [*path, nxt])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            walk(node, [node])
    assert not circles, "import circles: " + "; ".join(" -> ".join(c) for c in circles)


def test_the_product_never_imports_the_bench() -> None:
    """The demo, the benches and the test support are a distribution of their own
    (packages/bench): a product module that imported one would break every deployment,
    whose wheel does not hold it (tests/integration/test_install.py builds that wheel)."""
    found = []
    for path in sorted(STREAM.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            found += [f"{path.relative_to(ROOT)}: {n}" for n in names if n.split(".")[0] == BENCH]
    assert not found, "the product imports the bench:\n" + "\n".join(found)
