"""How much a window may hold, decided in one place. Four authors, each for its own reason,
and one reader-facing answer (`limit`):

- the spec: `window.max_items`, the ceiling (and `window.max_input_tokens`: the prompt
  tokens left for instances once the static prefix is counted, `item_tokens`);
- the shadow sample's controller: the window at which the batched decisions still agree
  with the small-window ones (`follow_quality`);
- the limiter: no more instances than the endpoint answered within the timeout;
- the output budget: instances whose expected answers fit it, learnt as answers come back.

The windower, the metrics and the operator's check read it from here; nothing else writes
a window's size. The spec is read from its one holder (`LiveSpec`, core/live_spec.py) at
each use; a spec whose window cannot hold the instructions is refused before it is live."""

from __future__ import annotations

from instanced_stream.core.live_spec import Edition, LiveSpec
from instanced_stream.core.solve import Outcome
from instanced_stream.core.tokenizer import Tokenizer
from instanced_stream.errors import SpecError
from instanced_stream.llm.limiter import Limiter

__all__ = ["WindowSize"]

_REQUEST_OVERHEAD = 64  # chat framing, the advisors' control message
_MIN_ROOM = 64  # prompt tokens a request needs for at least one small instance
_OUTPUT_MARGIN = 1.25  # answers vary: keep a quarter of the output budget spare
_LEARN = 0.2  # weight of the latest batch in the moving average of output per item


class WindowSize:
    def __init__(self, live: LiveSpec, tokenizer: Tokenizer, limiter: Limiter) -> None:
        self.live = live  # the spec, read at each use
        self.tokenizer = tokenizer
        self.limiter = limiter
        self.output_per_item = float(live.spec.window.output_tokens_per_item)
        # The prompt's tokens are counted once per edition of the spec (its `version`).
        self._counted = (live.version, self._room(live.edition))  # too small: not started
        live.check(self._room)  # a change to a spec whose window is too small is refused
        self.quality: int | None = None  # the controller's window; None: not following one

    @property
    def item_tokens(self) -> int:
        """Prompt tokens left for instances once the static prefix is counted."""
        edition = self.live.edition
        version, room = self._counted
        if version != edition.version:
            room = self._room(edition)
            self._counted = (edition.version, room)
        return room

    def follow_quality(self, items: int) -> None:
        """The shadow sample's controller moved the window to `items`."""
        self.quality = items

    def limit(self) -> tuple[int, str]:
        """Instances the open window may hold now, and which author set it: "items" (the
        spec or the quality controller) or "output" (the answer's budget, or the limiter)."""
        ceiling = self.live.spec.window.max_items
        if self.quality is not None:
            ceiling = min(ceiling, self.quality)
        fits = self.capacity()
        return (fits, "output") if fits < ceiling else (ceiling, "items")

    def _room(self, edition: Edition) -> int:
        """Prompt tokens left for instances once the static prefix is counted."""
        spec = edition.spec
        fixed = self.tokenizer.count(edition.system) + _REQUEST_OVERHEAD
        room = spec.window.max_input_tokens - fixed
        if room < _MIN_ROOM:
            raise SpecError(
                f"window.max_input_tokens is {spec.window.max_input_tokens}, but the "
                f"instructions, tools and advisors alone take about {fixed} tokens: "
                f"raise it to at least {fixed + _MIN_ROOM}"
            )
        return room

    def capacity(self) -> int:
        """Instances whose expected answers fit the output budget (measured as we go) and
        that the endpoint answers within the timeout."""
        spec = self.live.spec
        window = spec.window
        in_time = self.limiter.max_items or window.max_items
        budget = window.max_output_tokens or spec.model.max_output_tokens
        if budget is None:
            return min(window.max_items, in_time)
        return max(1, min(in_time, int(budget / (self.output_per_item * _OUTPUT_MARGIN))))

    def learn(self, outcome: Outcome, instances: int) -> None:
        if outcome.requests and instances:
            # The answer's own tokens: hidden reasoning has its headroom on top of the cap.
            per_item = (outcome.completion_tokens - outcome.reasoning_tokens) / instances
            self.output_per_item += _LEARN * (per_item - self.output_per_item)
