"""The window size (runtime/pipeline/windows/window_size.py): the smallest of the spec's
ceiling, the quality controller, the limiter and the output budget; a window closes when
the expected answer would outgrow it."""

from __future__ import annotations

from instanced_stream.core.live_spec import LiveSpec
from instanced_stream.core.tokenizer import Tokenizer
from instanced_stream.llm.limiter import Limiter
from instanced_stream.runtime.pipeline.windows.windowing import Windower


async def test_window_closes_when_the_expected_answer_would_outgrow_the_budget() -> None:
    closed: list[tuple[list[int], str]] = []

    async def on_close(items: list[int], reason: str) -> None:
        closed.append((items, reason))

    capacity = 3

    class Size:
        item_tokens = 1000

        def limit(self) -> tuple[int, str]:
            return (capacity, "output") if capacity < 10 else (10, "items")

    win: Windower[int] = Windower(
        size=Size(), max_wait_s=60, on_close=on_close, tokens_of=lambda i: 100
    )
    for i in range(4):
        await win.add(i)
    assert closed == [([0, 1, 2], "output")]
    capacity = 100
    for i in range(4, 20):
        await win.add(i)
    # prompt budget: ten items of 100 tokens fill 1000, the eleventh opens a new window
    assert [reason for _, reason in closed] == ["output", "items"]
    assert len(win) == 7


def test_windows_shrink_to_what_the_endpoint_answered_in_time() -> None:
    from instanced_stream.core.spec import load_spec
    from instanced_stream.runtime.pipeline.windows.window_size import WindowSize
    from instanced_stream.settings import DEFAULT_SPEC

    spec = load_spec(DEFAULT_SPEC)
    limiter = Limiter(4)
    size = WindowSize(LiveSpec(spec), Tokenizer(spec.model.name), limiter)
    assert size.capacity() == spec.window.max_items == 25
    assert size.limit() == (25, "items")
    limiter.on_timeout(25)
    assert size.capacity() == 12
    assert size.limit() == (12, "output")


def test_the_window_size_is_the_smallest_of_its_four_authors() -> None:
    """Spec, quality controller, limiter and output budget each bound the window; the one
    object every reader asks answers the smallest, and names which kind it was."""
    from instanced_stream.core.spec import load_spec
    from instanced_stream.runtime.pipeline.windows.window_size import WindowSize
    from instanced_stream.settings import DEFAULT_SPEC

    spec = load_spec(DEFAULT_SPEC)
    limiter = Limiter(4)
    size = WindowSize(LiveSpec(spec), Tokenizer(spec.model.name), limiter)
    assert size.limit() == (spec.window.max_items, "items")  # the spec's ceiling
    size.follow_quality(10)
    assert size.limit() == (10, "items")  # the controller's window
    limiter.on_timeout(16)
    assert size.limit() == (8, "output")  # what the endpoint answered in time
    size.follow_quality(40)  # never past the spec's ceiling
    limiter.on_success(0.1, 100, items=8, share_of_timeout=0.01)
    assert size.limit()[0] <= spec.window.max_items


def test_a_spec_whose_window_cannot_hold_its_instructions_is_refused_before_it_is_live() -> None:
    """The room for items follows the live spec's prompt, counted once per change; a change
    that leaves no room is refused whole (the context topic's change is not applied)."""
    import pytest
    from instanced_stream.core.spec import load_spec
    from instanced_stream.errors import SpecError
    from instanced_stream.runtime.pipeline.windows.window_size import WindowSize
    from instanced_stream.settings import DEFAULT_SPEC

    spec = load_spec(DEFAULT_SPEC)
    live = LiveSpec(spec)
    size = WindowSize(live, Tokenizer(spec.model.name), Limiter(4))
    room = size.item_tokens
    live.install(spec.model_copy(update={"instructions": spec.instructions * 4}))
    assert size.item_tokens < room
    tight = spec.window.model_copy(update={"max_input_tokens": 100})
    with pytest.raises(SpecError, match=r"window\.max_input_tokens is 100"):
        live.install(spec.model_copy(update={"window": tight}))
    assert live.spec.window.max_input_tokens == spec.window.max_input_tokens
