"""Progress of long commands (`stream eval`, `stream bench`) on stderr, so stdout keeps
only the result: a tqdm bar on a terminal; elsewhere (a CI log, a pipe, a file) plain
lines, one per tenth of the work at most, which a log keeps readable where a bar's
carriage returns would not."""

from __future__ import annotations

import sys
import time
from types import TracebackType
from typing import IO, Never

from tqdm import tqdm

__all__ = ["Progress"]


class Progress:
    """`with Progress("window 10", total=85, unit="items") as p: p.advance(10)`; `say()`
    prints a line of its own without breaking the bar, `finished()` counts one unit with
    its line (a bench run's figures). A total of None counts without a bar (the number of
    runs is not known ahead)."""

    def __init__(
        self,
        label: str,
        total: int | None,
        unit: str = "items",
        stream: IO[str] | None = None,
    ) -> None:
        self.label = label
        self.total = total
        self.unit = unit
        self.stream = stream or sys.stderr
        self.done = 0
        self.started = time.monotonic()
        self._shown_tenth = -1
        self.bar: tqdm[Never] | None = None
        if self.stream.isatty():
            self.bar = tqdm(total=total, desc=label, unit=f" {unit}", file=self.stream, leave=True)

    def advance(self, n: int = 1) -> None:
        self.done += n
        if self.bar is not None:
            self.bar.update(n)
            return
        if self.total:
            tenth = min(10, 10 * self.done // self.total)
            if tenth == self._shown_tenth:
                return
            self._shown_tenth = tenth
            share = f"{self.done}/{self.total} {self.unit} ({100 * self.done // self.total}%)"
        else:
            share = f"{self.done} {self.unit}"
        elapsed = time.monotonic() - self.started
        print(f"{self.label}: {share}, {elapsed:.0f}s", file=self.stream, flush=True)

    def say(self, line: str) -> None:
        if self.bar is not None:
            self.bar.write(line, file=self.stream)
        else:
            print(line, file=self.stream, flush=True)

    def finished(self, line: str) -> None:
        """One unit done, with its own line of figures (a bench run's row)."""
        self.done += 1
        if self.bar is not None:
            self.bar.update(1)
        self.say(f"{self.label}: {line}")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()

    def __enter__(self) -> Progress:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
