"""What every stage of the pipeline reads (`Shared`), given as one frozen value instead of
the same eight keywords passed by hand to admission and dispatch: the settings, the live
spec (read at each use: core/live_spec.py), the metrics, the record builder, the
workflows (None: a stateless spec), the window's size and its tokenizer, and the
workflow turns on their way. The stager builds it once."""

from __future__ import annotations

from dataclasses import dataclass

from instanced_stream.core.live_spec import LiveSpec
from instanced_stream.core.tokenizer import Tokenizer
from instanced_stream.observe.metrics import Metrics
from instanced_stream.runtime.pipeline.outcomes.records import RecordBuilder
from instanced_stream.runtime.pipeline.queued_turns import QueuedTurns
from instanced_stream.runtime.pipeline.windows.window_size import WindowSize
from instanced_stream.runtime.pipeline.workflows import Flows
from instanced_stream.settings import Settings

__all__ = ["Shared"]


@dataclass(frozen=True, slots=True)
class Shared:
    """The collaborators the stages share; none of them is replaced once built."""

    settings: Settings
    live: LiveSpec
    metrics: Metrics
    builder: RecordBuilder
    flows: Flows | None
    size: WindowSize
    tokenizer: Tokenizer
    queued_turns: QueuedTurns
