"""The window: closes on items, tokens and wait; exact token counts only when needed."""

from __future__ import annotations

import asyncio

from instanced_stream.runtime.pipeline.windows.windowing import FixedSize, Windower


async def test_window_closes_on_items_tokens_and_wait() -> None:
    closed: list[tuple[list[int], str]] = []

    async def on_close(items: list[int], reason: str) -> None:
        closed.append((items, reason))

    w: Windower[int] = Windower(
        size=FixedSize(3, 100), max_wait_s=0.05, on_close=on_close, tokens_of=lambda n: n
    )
    w.start()
    for n in (1, 2, 3):
        await w.add(n)
    assert closed == [([1, 2, 3], "items")]
    await w.add(60)
    await w.add(50)  # would exceed 100 tokens: the window closes before it
    assert closed[-1] == ([60], "tokens")
    await asyncio.sleep(0.15)
    assert closed[-1] == ([50], "wait")
    await w.stop()


async def test_a_loose_bound_closes_windows_where_exact_counts_would() -> None:
    """Items are counted exactly only when their bounds cannot prove the window fits;
    the windows close on tokens exactly where exact counts alone would close them."""
    closed: list[tuple[list[int], str]] = []
    counted: list[int] = []

    async def on_close(items: list[int], reason: str) -> None:
        closed.append((items, reason))

    def exact(n: int) -> int:
        counted.append(n)
        return n

    w: Windower[int] = Windower(
        size=FixedSize(10, 100),
        max_wait_s=5,
        on_close=on_close,
        tokens_of=exact,
        bound_of=lambda n: 2 * n,
    )
    for n in (10, 20, 15):  # bounds 20 + 40 + 30 = 90: no count needed
        await w.add(n)
    assert counted == [] and closed == []
    await w.add(30)  # bound 60 passes 100: the window is counted, 45 + 30 fits
    assert counted == [10, 20, 15, 30] and closed == []
    await w.add(26)  # 75 + 26 would pass 100: closes before it
    assert closed == [([10, 20, 15, 30], "tokens")]
    await w.flush()
    assert closed[-1] == ([26], "flush")
