"""What the operations endpoint reports about dispatching: readiness and status.

Read from the triggerer's :class:`~sharedstream.dispatch.dispatcher.Dispatcher`
on its event loop, like everything :mod:`sharedstream.runtime.ops_view`
reads: its per-target counters (this process's attempts since it started)
and its count of the store's unfinished runs (refreshed every
``[dispatch] follow_interval``, so a scrape never queries the store).

* readiness - the ``dispatch`` check (present only while the triggerer
  dispatches) fails while a target's last attempts all failed: runs wait in
  the store (nothing is lost; ingestion goes on), and someone should look;
* status - per target: its deliveries under way and capacity, the runs
  waiting for it (queued), at it (dispatched, running) and recovering, what
  its attempts came to, and its last error;
* metrics - the same as Prometheus families (``sharedstream_dag_runs``,
  ``sharedstream_dispatch_*``), in :mod:`sharedstream.runtime.ops_metrics`.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from sharedstream.dispatch.dispatcher import Dispatcher
from sharedstream.runtime.ops_base import Check

__all__ = ["OUTCOMES", "dispatch_check", "dispatch_status"]

OUTCOMES = ("dispatched", "succeeded", "failed", "retried", "undeliverable")


def dispatch_check(dispatcher: Dispatcher) -> Check:
    """``dispatch``: ok unless a target's last attempts all failed (it looks down)."""
    health = dispatcher.health()
    down = [f"{name}: {detail}" for name, ok, detail in health if not ok]
    if down:
        return Check("dispatch", False, "; ".join(down) + " (runs wait in the store)")
    return Check("dispatch", True, "; ".join(f"{name}: {detail}" for name, _, detail in health))


def _by_target(dispatcher: Dispatcher) -> dict[str, Counter[str]]:
    waiting: dict[str, Counter[str]] = {}
    for (_dag, target, state), count in dispatcher.unfinished.items():
        waiting.setdefault(target, Counter())[state] += count
    return waiting


def dispatch_status(dispatcher: Dispatcher) -> list[dict[str, Any]]:
    """One record per target, and one for runs with no target yet (``target`` ``""``)."""
    waiting = _by_target(dispatcher)
    names = sorted({*dispatcher.stats, *waiting})
    records = []
    for name in names:
        stats = dispatcher.stats.get(name)
        slots = dispatcher.slots.get(name)
        states = waiting.get(name, Counter())
        records.append({
            "target": name, "delivering": slots.busy if slots else 0,
            "capacity": slots.capacity if slots else 0,
            "queued": states["queued"], "dispatching": states["dispatching"],
            "at_target": states["dispatched"] + states["running"],
            "failing": bool(stats and stats.failing),
            "last_error": stats.last_error if stats else None,
            **{outcome: getattr(stats, outcome) if stats else 0 for outcome in OUTCOMES},
        })
    return records
