"""The live spec: the one owner of the spec the processor runs on now, and of what is
derived from it once per change (its prompt, its validator); every reader reads it here at
the moment of use, and nothing else keeps a copy to be kept in step.

A change (the context topic's, runtime/pipeline/overrides.py) is installed whole or not at
all: the new `Edition` is made and every check asked before it becomes the live one, so a
spec that cannot run (a window too small for its instructions) leaves the running one as
it was. An object that keeps something derived from the spec (a cache key, a token count)
notices a change by the edition's `version`, or asks to be told (`LiveSpec.follow`).

A batch takes the edition live when it is launched and is asked, sampled and built on it
to the end (runtime/pipeline/dispatch.py): a change meanwhile is the next batch's.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from instanced_stream.core.model import Model
from instanced_stream.core.prompt import PromptBuilder
from instanced_stream.core.solve import Solver
from instanced_stream.core.spec import AgentSpec
from instanced_stream.core.validate import Validator

__all__ = ["Edition", "LiveSpec", "SpecSource"]


class SpecSource(Protocol):
    """Where a reader reads the spec at each use: the `LiveSpec` (the spec live now) or one
    `Edition` (a batch's, to its end)."""

    @property
    def spec(self) -> AgentSpec: ...


@dataclass(frozen=True, eq=False)
class Edition:
    """One spec as it was installed, with what is derived from it, made once: readers that
    need the spec and its prompt take both from one edition, so the two never disagree.
    `version` is this edition's alone (a refused one's is not used again)."""

    version: int
    spec: AgentSpec
    prompt: PromptBuilder
    validator: Validator

    @classmethod
    def of(cls, version: int, spec: AgentSpec) -> Edition:
        """`spec` and what is derived from it (raises what deriving raises)."""
        return cls(version, spec, PromptBuilder(spec), Validator(spec))

    @property
    def system(self) -> str:
        """The system prompt: the instructions, tools, advisors and answer form."""
        return self.prompt.system

    def solver(self, llm: Model, max_attempts: int, max_consults: int | None = None) -> Solver:
        """A solver on `llm` for this edition (`max_consults`: the spec's unless given). It
        holds nothing of its own: the prompt and validator are the edition's."""
        consults = self.spec.advice.max_consults if max_consults is None else max_consults
        return Solver(llm, self.prompt, self.validator, max_attempts, consults)


class LiveSpec:
    """A store with one writer (`install`): the live `Edition`, the checks a new spec must
    pass and the readers told of each change."""

    def __init__(self, spec: AgentSpec) -> None:
        self._versions = itertools.count(1)
        self._edition = Edition.of(next(self._versions), spec)
        self._checks: list[Callable[[Edition], object]] = []
        self._followers: list[Callable[[Edition], None]] = []

    @property
    def edition(self) -> Edition:
        return self._edition

    @property
    def spec(self) -> AgentSpec:
        return self._edition.spec

    @property
    def version(self) -> int:
        return self._edition.version

    def check(self, refuse: Callable[[Edition], object]) -> None:
        """`refuse` is asked about each new edition before it is installed; by raising,
        it refuses the change (the live edition stays)."""
        self._checks.append(refuse)

    def follow(self, changed: Callable[[Edition], None]) -> None:
        """`changed` is told each edition just installed, in the order the followers
        asked. It cannot refuse it any more: a follower must not raise."""
        self._followers.append(changed)

    def install(self, spec: AgentSpec) -> Edition:
        """`spec` is the live spec from now on, or (deriving from it, or a check, raised)
        the live one stays as it was and the error is the caller's."""
        edition = Edition.of(next(self._versions), spec)
        for refuse in self._checks:
            refuse(edition)
        self._edition = edition
        for changed in self._followers:
            changed(edition)
        return edition
