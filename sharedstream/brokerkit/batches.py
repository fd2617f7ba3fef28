"""Batched broker calls: split items into the API's batch size, a few calls at a time.

Brokers cap how many entries one call may carry (SQS: 10, Pub/Sub: 2,500
ack ids, ...). :func:`chunks` splits a sequence in order;
:func:`in_batches` makes one call per chunk, at most ``concurrency`` in
flight, and returns their results in chunk order. What a call does with a
failure is the caller's business: an exception from one call propagates
(the other calls of its round still finish first).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

__all__ = ["chunks", "in_batches"]

_T = TypeVar("_T")
_R = TypeVar("_R")


def chunks(items: Sequence[_T], size: int) -> list[Sequence[_T]]:
    """``items`` in consecutive slices of at most ``size``, order kept."""
    return [items[i:i + size] for i in range(0, len(items), size)]


async def in_batches(
    items: Sequence[_T],
    call: Callable[[Sequence[_T]], Awaitable[_R]],
    *,
    size: int,
    concurrency: int,
) -> list[_R]:
    """Await ``call(chunk)`` for every chunk of ``items``, ``concurrency`` at a time."""
    parts = chunks(items, size)
    results: list[_R] = []
    for start in range(0, len(parts), concurrency):
        results.extend(await asyncio.gather(*(call(part) for part in
                                              parts[start:start + concurrency])))
    return results
