"""The README and docs/ say only what exists: every `stream ...` command they show is a
sub-command of the CLI's own parser with the flags it shows, every relative link points at
a file that exists (and a `#fragment` at one of its headings), and the README stays short
enough for a newcomer (under 300 lines)."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest
from instanced_stream.cli.parser import build_parser
from instanced_stream.settings import OTHER_VARIABLES, Settings

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("**/*.md"))]

FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)
INLINE = re.compile(r"`([^`]+)`")
# `stream` as a command: at the start of a snippet or after a shell separator, followed
# by a word (a flag or a sub-command); `./dev demo|test` runs the same commands.
INVOCATION = re.compile(r"(?:^|[\s;&|(=])(stream|\./dev)((?:\s+[^\s;&|#]+)+)")
# ./dev's own commands (its usage lines); `./dev demo` is `stream demo` with set-up first
DEV = ROOT / "dev"
FLAG = re.compile(r"^(--?[A-Za-z][\w-]*)")


def _snippets(text: str) -> list[str]:
    """Code blocks (continued lines joined, comments dropped) and inline code spans."""
    found: list[str] = []
    for block in FENCE.findall(text):
        joined = re.sub(r"\\\n\s*", " ", block)
        found.extend(line.split(" #", 1)[0] for line in joined.splitlines())
    prose = FENCE.sub("", text)
    # a table cell writes alternatives as `a\\|b`: not a shell pipe
    found.extend(span.replace("\n", " ").replace("\\|", " ") for span in INLINE.findall(prose))
    return found


def _help(*argv: str) -> str:
    """What `stream ARGV --help` prints: the parser's public account of its commands and
    flags (argparse keeps its sub-parsers in private attributes)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        build_parser().parse_args([*argv, "--help"])
    return out.getvalue()


def _commands() -> set[str]:
    listed = re.search(r"\{([\w,-]+)\}", _help())
    assert listed is not None, "the CLI's help lists no sub-commands"
    return set(listed.group(1).split(","))


def _flags(*argv: str) -> set[str]:
    return set(re.findall(r"(?<![\w-])(--?[A-Za-z][\w-]*)", _help(*argv)))


def _shown_commands() -> list[tuple[str, str, list[str]]]:
    """(page, command, flags) for every `stream COMMAND --flag ...` the pages show."""
    shown = []
    for page in PAGES:
        for snippet in _snippets(page.read_text(encoding="utf-8")):
            for match in INVOCATION.finditer(snippet):
                words = [w.lstrip("[(") for w in match.group(2).split()]
                flags = [m.group(1) for w in words if (m := FLAG.match(w))]
                command = next((w for w in words if not w.startswith(("-", "["))), "")
                # global flags may come before the command; their values are not commands
                if words and words[0] in ("--bootstrap-servers", "--topic-prefix", "--spec"):
                    command = words[2] if len(words) > 2 else ""
                command = command.strip("[]()")
                if match.group(1) == "./dev" and command != "demo":
                    command = f"./dev {command}"
                shown.append((page.name, command, flags))
    return shown


def test_the_pages_show_commands_at_all() -> None:
    # the patterns above find what they should: a regression in them would pass vacuously
    commands = {command for _, command, _ in _shown_commands()}
    assert {"demo", "process", "check", "eval", "bench", "activities", "audit"} <= commands


@pytest.mark.parametrize(("page", "command", "flags"), _shown_commands())
def test_every_command_shown_exists_with_its_flags(
    page: str, command: str, flags: list[str]
) -> None:
    if command.startswith("./dev "):
        # ./dev's own (`./dev test -m ...` passes its flags to pytest)
        assert f"\n#   {command} " in DEV.read_text(encoding="utf-8"), f"{page}: no {command}"
        return
    if command.startswith("<"):
        return  # `stream <command> --help`
    if not command:  # `stream --help`, `stream --version`
        assert set(flags) <= _flags(), f"{page}: stream {flags}"
        return
    assert command in _commands(), f"{page}: `stream {command}` is not a command"
    unknown = set(flags) - _flags(command) - _flags()
    assert not unknown, f"{page}: `stream {command}` has no {sorted(unknown)}"


LINK = re.compile(r"\]\(([^)\s]+)\)")


def _anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    text = FENCE.sub("", page.read_text(encoding="utf-8"))
    heads = re.findall(r"^#{1,6} (.+)$", text, re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in heads}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path) -> None:
    broken = []
    for target in LINK.findall(FENCE.sub("", page.read_text(encoding="utf-8"))):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        path, _, fragment = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        missing = not file.exists()
        if missing or (fragment and file.suffix == ".md" and fragment not in _anchors(file)):
            broken.append(target)
    assert not broken, f"{page.name}: broken links {broken}"


def test_the_readme_is_short_and_links_every_docs_page() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) < 300
    for page in sorted((ROOT / "docs").glob("*.md")):
        assert f"docs/{page.name}" in readme, f"the README does not link docs/{page.name}"
    # the two opening commands stay the first thing a newcomer sees
    first = FENCE.search(readme)
    assert first is not None
    assert "./dev demo" in first.group(1) and "./dev test" in first.group(1)


def test_the_settings_page_lists_every_variable() -> None:
    """The README says docs/settings.md lists every `STREAM_*` variable: each setting
    (under the variable it is read from) and each other variable the tools read."""
    page = (ROOT / "docs" / "settings.md").read_text(encoding="utf-8")
    variables = set(OTHER_VARIABLES)
    for name, info in Settings.model_fields.items():
        alias = info.validation_alias
        variables.add(alias if isinstance(alias, str) else f"STREAM_{name.upper()}")
    missing = sorted(v for v in variables if f"`{v}`" not in page)
    assert not missing, f"docs/settings.md does not list {missing}"
