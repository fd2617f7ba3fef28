"""The garbage collector's young-generation threshold while a triggerer runs.

A triggerer allocates a few short-lived objects per raw event and per
delivery (records, futures, advance items, trigger events); reference
counting frees nearly all of them. Python's young-generation threshold
(700 more allocations than frees) nonetheless starts a collection every few
hundred raw events once a few hundred are in flight, and each one walks
every young object and, every tenth, the older generations that hold the
long-lived state (one parked coroutine per subscriber, the records in
flight): work that finds almost nothing. At K = 1000 selective watchers that
was about a fifth of the engine's CPU (see ``docs/benchmarks.md``).

:func:`tune_collector` raises the young-generation threshold; the older two
keep Python's values. Nothing is collected or frozen at that moment, so
starting costs nothing. Cycles are still collected, a little later: cyclic
garbage waits for at most the threshold's worth of allocations.
:meth:`Collector.restore` puts the thresholds back (the embedded triggerer
and the tests run in processes that go on afterwards).
"""

from __future__ import annotations

import gc
from dataclasses import dataclass

__all__ = ["Collector", "tune_collector"]


@dataclass(frozen=True)
class Collector:
    """The thresholds a :func:`tune_collector` call replaced."""

    thresholds: tuple[int, int, int]

    def restore(self) -> None:
        """Python's thresholds as they were."""
        gc.set_threshold(*self.thresholds)


def tune_collector(gen0_threshold: int) -> Collector | None:
    """Set the young-generation threshold to ``gen0_threshold`` (``0``: change nothing)."""
    if gen0_threshold <= 0:
        return None
    before = gc.get_threshold()
    gc.set_threshold(gen0_threshold, before[1], before[2])
    return Collector(before)
