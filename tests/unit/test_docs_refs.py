"""Every reference to the code in the docs resolves: what a page or a docstring names in
backticks exists, so a rename or a removal that leaves a page behind fails here.

Where: inline code spans (`...`) of README.md and docs/**/*.md and of every module's and
class's docstring under stream/instanced_stream and the bench's
packages/bench/src/instanced_stream_bench. A fenced block with a language (```bash,
```python, ```json) is an example, not a reference, and is left out; one without (a
diagram, as docs/architecture.md's picture, or a command's output) is read for paths and
for `Class.attr` names of the package's classes, the two kinds that cannot be mistaken
for something else there.

What counts as a reference (a span without spaces; a trailing `()` is dropped):

- a **path**: path characters only, with a `/`, whose first part is a top-level folder
  of the repository (`stream/...`, `tests/...`, `docs/...`, `deploy/...`, `examples/...`)
  or a sub-package of instanced_stream or of the bench (`runtime/units/lifecycle.py`,
  `harness/demo.py`); or a test file by its name alone (`test_docs.py`, anywhere under
  tests/). It resolves when the file or folder exists under the repository's root,
  stream/instanced_stream, the bench's package or the page's own folder.
  `path/module.name` names `name` in that module, and `file.py::name[::name]` a function
    or class of that file (a pytest node id): the name must be defined there. A bare file
  name that is not a test (`activities.py`,
  `agent.yaml`) is left alone: pages use those for a user's files.
- a **dotted name** (`a.b`, identifiers only) whose first part is
  - `instanced_stream` (or `instanced_stream_bench`): the module path and the names
    after it exist in that package;
  - a class defined in the package (`Dispatch.launch`, `InstanceState.applied`): the class
    has that attribute (a method, a property, a field, or an attribute one of its
    methods sets on `self`), its bases included; deeper parts are not followed;
  - the name of a module or sub-package of the package, as code calls it
    (`plan_graph.advance`, `clients.producer`): that module defines the name. Several
    such names are also the first key of a configuration or a record (`model.answer`,
    `advice.max_consults`, `settings.max_output_bytes`, an activity record's
    `batch.token`, the Helm chart's `activities.replicas`), so such a span also resolves
    as a key path (fields by name or alias) of the agent spec, of `Settings`, of a
    message contract (ops/schemas.py), or of the chart's values.yaml.
  Anything else is not a reference to this package: env vars (`STREAM_SPEC`), CLI flags,
  topics (`stream.results`, `activity.<tool>`), other libraries' names (`mode.Service`,
  faust's `Stream.ack`), and the first parts in `FOREIGN`, which name another
  vocabulary that happens to share a module's name.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
import textwrap
import typing
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml
from instanced_stream.core.spec import AgentSpec
from instanced_stream.ops.schemas import CONTRACTS
from instanced_stream.settings import Settings
from pydantic import AliasChoices, BaseModel

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "stream" / "instanced_stream"
BENCH = ROOT / "packages" / "bench" / "src" / "instanced_stream_bench"
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("**/*.md"))]
CHART_VALUES = ROOT / "deploy" / "helm" / "instanced-stream" / "values.yaml"

FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)
BARE_FENCE = re.compile(r"^```\n(.*?)^```", re.S | re.M)  # no language: a diagram, an output
INLINE = re.compile(r"`([^`]+)`")
PATH = re.compile(r"[\w.-]+(?:/[\w.-]*)+")
TEST_FILE = re.compile(r"test_\w+\.py")
# A file by its name alone: a path, never a dotted name (`asyncapi.yaml`, `agent.yaml`).
FILE_NAME = re.compile(r"[\w.-]+\.(?:py|md|ya?ml|json|jsonl|toml|txt|html|xml|png|gguf)")
NODE = re.compile(r"(?P<file>[\w./-]+\.py)::(?P<names>\w+(?:::\w+)*)")
DOTTED = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+")
# First parts of dotted names that share a module's name but name something else in
# these pages: Kafka's client and broker properties (`client.id`, beside llm/client.py;
# `controller.quorum.voters`, beside core/controller.py) and OpenTelemetry's attributes
# (`server.address`, beside testing/sim/server.py).
FOREIGN = frozenset({"client", "controller", "server"})


def _docstrings(path: Path) -> Iterator[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    nodes: list[ast.Module | ast.ClassDef] = [tree]
    nodes += [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)]
    for node in nodes:
        doc = ast.get_docstring(node)
        if doc:
            yield doc


def _texts() -> Iterator[tuple[str, Path, str]]:
    """(where, the folder a relative path may start from, text) of every page and docstring."""
    for page in PAGES:
        yield str(page.relative_to(ROOT)), page.parent, FENCE.sub("", page.read_text("utf-8"))
    for module in sorted([*PACKAGE.rglob("*.py"), *BENCH.rglob("*.py")]):
        for doc in _docstrings(module):
            yield str(module.relative_to(ROOT)), module.parent, doc


def _in_diagrams(page: Path) -> Iterator[str]:
    """The paths and the `Class.attr` names of the package's classes in the page's fenced
    blocks without a language."""
    for block in BARE_FENCE.findall(page.read_text("utf-8")):
        for word in re.findall(r"(?<![\w./-])[\w.-]+(?:/[\w.-]+)+", block):
            yield word.rstrip(".")
        for word in re.findall(r"(?<![\w.])[A-Z]\w*\.[A-Za-z_]\w*", block):
            if word.split(".")[0] in _classes():
                yield word


def _spans() -> list[tuple[str, Path, str]]:
    found = []
    for where, folder, text in _texts():
        for span in INLINE.findall(text):
            span = span.strip().removesuffix("()")
            if span and not any(c.isspace() for c in span):
                found.append((where, folder, span))
    for page in PAGES:
        found += [(str(page.relative_to(ROOT)), page.parent, w) for w in _in_diagrams(page)]
    return found


# ------------------------------------------------------------------ what the code defines


def _modules_of(package: Path) -> dict[str, Path]:
    found = {}
    for path in package.rglob("*.py"):
        parts = path.relative_to(package).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


@cache
def _modules() -> dict[str, Path]:
    """Dotted module name under instanced_stream ("" for the package) -> its file."""
    found = _modules_of(PACKAGE)
    found["examples"] = ROOT / "examples" / "__init__.py"  # shipped as instanced_stream.examples
    return found


@cache
def _bench_modules() -> dict[str, Path]:
    """The same for the bench's package, instanced_stream_bench."""
    return _modules_of(BENCH)


@cache
def _defined(path: Path) -> frozenset[str]:
    """The names a module defines at its top level (and, for a package, its modules)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    if path.name == "__init__.py":
        names.update(p.stem for p in path.parent.glob("*.py"))
        names.update(p.name for p in path.parent.iterdir() if (p / "__init__.py").exists())
    return frozenset(names)


@cache
def _by_short_name() -> dict[str, list[str]]:
    """A module's or sub-package's own name (`plan_graph`, `units`) -> its dotted names."""
    found: dict[str, list[str]] = {}
    for dotted in _modules():
        if dotted:
            found.setdefault(dotted.rsplit(".", 1)[-1], []).append(dotted)
    return found


@cache
def _classes() -> dict[str, list[str]]:
    """A class's name -> the modules that define one by that name at their top level."""
    found: dict[str, list[str]] = {}
    for dotted, path in _modules().items():
        if dotted == "examples":
            continue
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.ClassDef):
                found.setdefault(node.name, []).append(dotted)
    return found


def _set_on_self(cls: type) -> set[str]:
    """The attributes the methods of `cls` assign on `self`."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError):
        return set()
    names = set()
    for node in ast.walk(tree):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = [
                e for t in node.targets for e in (t.elts if isinstance(t, ast.Tuple) else [t])
            ]
        elif isinstance(node, ast.AnnAssign | ast.AugAssign):
            targets = [node.target]
        for target in targets:
            if (
                isinstance(target, ast.Attribute)
                and isinstance(target.value, ast.Name)
                and target.value.id == "self"
            ):
                names.add(target.attr)
    return names


def _has(cls: type, name: str) -> bool:
    """`cls` has `name`: as a class attribute (a method, a property, a default; its bases
    included), an annotated field (pydantic, dataclass, NamedTuple, protocol), or an
    attribute one of its methods, or its bases' in the package, sets on `self`."""
    return hasattr(cls, name) or any(
        name in inspect.get_annotations(klass)
        or (klass.__module__.startswith("instanced_stream") and name in _set_on_self(klass))
        for klass in cls.__mro__
    )


def _class_has(class_name: str, attr: str) -> bool:
    """Some class of the package named `class_name`, at the top level of its module, has
    `attr`."""
    for dotted in _classes()[class_name]:
        module = importlib.import_module(f"instanced_stream.{dotted}" if dotted else PACKAGE.name)
        found = vars(module).get(class_name)
        if isinstance(found, type) and _has(found, attr):
            return True
    return False


# ------------------------------------------------------------------ configuration keys


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models_in(arg)]


def _spellings(name: str, info: Any) -> set[str]:
    spelled = {name}
    for alias in (info.alias, info.validation_alias, info.serialization_alias):
        if isinstance(alias, str):
            spelled.add(alias)
        elif isinstance(alias, AliasChoices):
            spelled.update(a for a in alias.choices if isinstance(a, str))
    return spelled


def _model_key(models: list[type[BaseModel]], keys: list[str]) -> bool:
    """`keys` is a path of fields (or their aliases) through `models`."""
    for key in keys:
        nested: list[type[BaseModel]] = []
        found = False
        for model in models:
            for name, info in model.model_fields.items():
                if key in _spellings(name, info):
                    found = True
                    nested += _models_in(info.annotation)
        if not found:
            return False
        if not nested:
            return True  # a mapping or a value: its keys are the user's own
        models = nested
    return True


@cache
def _chart_values() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(CHART_VALUES.read_text(encoding="utf-8"))
    return loaded


def _values_key(keys: list[str]) -> bool:
    node: Any = _chart_values()
    for key in keys:
        if not isinstance(node, dict) or key not in node:
            return False
        node = node[key]
    return True


def _config_key(span: str) -> bool:
    """`span` is a key path of the agent spec, of `Settings` (as `settings.x`), of a record
    of the message contracts (`batch.token`), or of the chart's values."""
    keys = span.split(".")
    return (
        _model_key([AgentSpec], keys)
        or (keys[0] == "settings" and _model_key([Settings], keys[1:]))
        or _model_key(list(CONTRACTS.values()), keys)
        or _values_key(keys)
    )


# ------------------------------------------------------------------ resolving one span


def _missing(path: Path, names: list[str]) -> str | None:
    """What of `names` the module at `path` lacks: `names[0]` defined there, and when it is
    a class, `names[1]` one of its attributes (None: nothing is missing)."""
    if names[0] not in _defined(path):
        return f"{path.name} defines no {names[0]}"
    if len(names) > 1 and names[0] in _classes() and not _class_has(names[0], names[1]):
        return f"{names[0]} has no attribute {names[1]}"
    return None


def _file(span: str, folder: Path) -> Path | None:
    for base in (ROOT, PACKAGE, BENCH, folder):
        if (base / span).exists():
            return base / span
    return None


@cache
def _roots() -> frozenset[str]:
    """The first parts a path reference starts with: the repository's top-level folders
    and the package's sub-packages. Not `artifacts/`: what the suite writes there (the
    live page's screenshots) exists only once a browser test has run, and a unit test
    beside it on the other worker would read a reference to it as broken."""
    top = {
        p.name
        for p in ROOT.iterdir()
        if p.is_dir() and not p.name.startswith(".") and p.name != "artifacts"
    }
    subs = {
        p.name for root in (PACKAGE, BENCH) for p in root.iterdir() if (p / "__init__.py").exists()
    }
    return frozenset(top | subs | {".ci"})


def _is_path(span: str) -> bool:
    return "/" in span or "::" in span or bool(FILE_NAME.fullmatch(span))


def _counts(span: str) -> bool:
    """The rule of the module's docstring: `span` is read as a reference to the code."""
    if _is_path(span):
        return bool(
            NODE.fullmatch(span)
            or TEST_FILE.fullmatch(span)
            or (PATH.fullmatch(span) and span.split("/", 1)[0] in _roots())
        )
    if not DOTTED.fullmatch(span):
        return False
    first = span.split(".", 1)[0]
    return (
        first in ("instanced_stream", "instanced_stream_bench")
        or first in _classes()
        or (first in _by_short_name() and first not in FOREIGN)
    )


def _test_file(name: str) -> Path | None:
    return next(iter(sorted((ROOT / "tests").rglob(Path(name).name))), None)


def _path(span: str, folder: Path) -> str | None:
    """Why a path reference does not resolve (None: it does)."""
    node = NODE.fullmatch(span)
    if node is not None:
        found = _file(node["file"], folder) or _test_file(node["file"])
        if found is None:
            return "no such file"
        return _missing(found, node["names"].split("::"))
    if TEST_FILE.fullmatch(span):
        return None if _test_file(span) else "no such test file"
    if _file(span, folder) is not None:
        return None
    stem, dot, name = span.rpartition(".")
    module = _file(stem + ".py", folder) if dot and "/" not in name else None
    if module is not None:  # `runtime/pipeline/outcomes/scopes.imported`: a name in that module
        return _missing(module, [name])
    return "no such file or folder"


def _dotted(span: str) -> str | None:
    """Why a dotted reference does not resolve (None: it does)."""
    first, *rest = span.split(".")
    if first == "instanced_stream":
        return _package_path(rest)
    if first == "instanced_stream_bench":
        return _package_path(rest, _bench_modules())
    if first in _classes():
        return None if _class_has(first, rest[0]) else f"{first} has no attribute {rest[0]}"
    modules = [_modules()[d] for d in _by_short_name()[first]]
    if any(_missing(m, rest[:2]) is None for m in modules) or _config_key(span):
        return None
    return f"no module {first} defines {rest[0]} (nor is it a configuration key)"


def _package_path(parts: list[str], modules: dict[str, Path] | None = None) -> str | None:
    modules = _modules() if modules is None else modules
    for cut in range(len(parts), -1, -1):
        dotted = ".".join(parts[:cut])
        if dotted in modules:
            rest = parts[cut:]
            return _missing(modules[dotted], rest[:2]) if rest else None
    return "no such module"


def _problem(span: str, folder: Path) -> str | None:
    """Why `span` names nothing (None: it resolves, or it is no reference)."""
    if not _counts(span):
        return None
    return _path(span, folder) if _is_path(span) else _dotted(span)


def _broken() -> list[str]:
    return [
        f"{where}: `{span}`: {why}"
        for where, folder, span in _spans()
        if (why := _problem(span, folder)) is not None
    ]


# ------------------------------------------------------------------ the tests


def test_every_reference_in_the_docs_and_docstrings_resolves() -> None:
    broken = _broken()
    assert not broken, "references to nothing:\n" + "\n".join(broken)


def test_the_rule_finds_references_of_every_kind() -> None:
    """The patterns find what they should: a regression in them would pass vacuously."""
    found = {span for _, _, span in _spans() if _counts(span)}
    assert {"Unit.commit", "runtime/units/unit.py", "plan_graph.advance"} <= found
    assert {"instanced_stream.examples", "model.answer", "test_fuzz.py"} <= found
    picture = set(_in_diagrams(ROOT / "docs" / "architecture.md"))
    assert {"Answers.on_result", "Stager.offer_turn", "Flows.expire"} <= picture
    assert len(found) > 200
    for not_one in ("STREAM_SPEC", "stream.results", "mode.Service", "--spec", "client.id"):
        assert not_one not in found


@pytest.mark.parametrize(
    ("span", "why"),
    [
        ("Dispatch.launch", None),
        ("Dispatch._launch", "Dispatch has no attribute _launch"),
        ("Unit.owner", None),  # set on self in __init__
        ("InstanceState.applied", None),  # a pydantic field
        ("InstanceState.outbox", "InstanceState has no attribute outbox"),
        ("plan_graph.advance", None),
        ("plan_graph.advanced", "no module plan_graph defines advanced (nor is it"),
        ("model.answer", None),  # the agent spec's key
        ("activities.replicas", None),  # the chart's value
        ("instanced_stream.core.state.InstanceState", None),
        ("instanced_stream.core.state.Outgoing", "state.py defines no Outgoing"),
        ("runtime/units/lifecycle.py", None),
        ("runtime/pipeline/dispatch.py::Dispatch::launch", None),
        ("runtime/pipeline/dispatch.py::Dispatch::_launch", "Dispatch has no attribute _launch"),
        ("docs/DESIGN.md", "no such file or folder"),
        ("test_docs_refs.py", None),
        ("mode.Service", None),  # not this package's
        ("asyncapi.yaml", None),  # a file's name, not ops/asyncapi.py's `yaml`
        ("settings.max_output_bytes", None),  # a field of Settings
        ("batch.token", None),  # a key of an activity record
        ("activities.replicaz", "no module activities defines replicaz"),
    ],
)
def test_one_span(span: str, why: str | None) -> None:
    found = _problem(span, PACKAGE)
    assert (found is None) if why is None else (found is not None and found.startswith(why))
