"""The rooms the docs name exist: README's layout table and the floors drawn in
docs/architecture.md name the package's floors and rooms by their module or package
name, and a room renamed or removed (an earlier layout named `steps`, `engine` and
`batch`, long gone) fails here rather than being read by a newcomer as a place to look."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "stream" / "instanced_stream"
_TICKED = re.compile(r"`([A-Za-z_][\w.]*)`")
# A ticked name that is a room, not the command a floor holds (`stream` command).
_ROOM = re.compile(r"`([A-Za-z_][\w.]*)`(?! command)")


def _exists(room: Path) -> bool:
    """A module (`x.py`) or a package (`x/__init__.py`)."""
    return room.with_suffix(".py").is_file() or (room / "__init__.py").is_file()


def layout_rows(readme: str) -> list[tuple[list[str], list[str]]]:
    """README's layout table: per floor, its packages and the rooms it names in them."""
    section = readme.split("## Layout", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0].isdigit():
            rows.append((_TICKED.findall(cells[1]), _ROOM.findall(cells[2])))
    return rows


def missing_in_layout(readme: str) -> list[str]:
    missing = []
    for packages, rooms in layout_rows(readme):
        missing += [p for p in packages if not _exists(PACKAGE / p)]
        if len(packages) == 1:  # a floor of one package: what it holds are its rooms
            missing += [
                f"{packages[0]}.{r}" for r in rooms if not _exists(PACKAGE / packages[0] / r)
            ]
    return missing


def drawn_floors(architecture: str) -> dict[str, list[str]]:
    """The floors drawn at the top of docs/architecture.md: floor -> the rooms drawn on
    it (`runtime  service <- batch_api <- ...`)."""
    block = architecture.split("```", 2)[1]
    floors: dict[str, list[str]] = {}
    for line in block.splitlines():
        name, _, rest = line.partition(" ")
        if name == "runtime":
            floors[name] = [
                w for w in re.split(r"\s*(?:<-|\|)\s*", rest.strip().split("(")[0]) if w
            ]
    return floors


def missing_in_drawing(architecture: str) -> list[str]:
    missing = []
    for floor, rooms in drawn_floors(architecture).items():
        for room in rooms:
            # pipeline's two lower rooms (windows, outcomes) are drawn on their own floor
            places = [PACKAGE / floor / room, PACKAGE / floor / "pipeline" / room]
            if not any(_exists(p) for p in places):
                missing.append(f"{floor}.{room}")
    return missing


def test_every_room_in_the_readme_layout_exists() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(layout_rows(readme)) >= 6  # the table was found
    assert missing_in_layout(readme) == []


def test_every_room_drawn_in_the_architecture_exists() -> None:
    drawing = (ROOT / "docs" / "architecture.md").read_text()
    assert len(drawn_floors(drawing).get("runtime", [])) >= 6  # the drawing was found
    assert missing_in_drawing(drawing) == []


def test_a_room_that_is_gone_is_found() -> None:
    """The check can fail: the layout of an earlier release, with rooms since renamed."""
    old = "## Layout\n\n| 4 | `runtime` | the processor: `steps`, `engine`, `batch`, `units` |\n"
    assert missing_in_layout(old) == ["runtime.steps", "runtime.engine", "runtime.batch"]
    drawing = "x\n```\nruntime      service <- engine <- units\n```\n"
    assert missing_in_drawing(drawing) == ["runtime.engine"]
