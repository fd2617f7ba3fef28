"""A standalone trigger runs on exactly one of several triggerers, and moves when its owner dies.

Three real ``sharedstream triggerer`` processes on one PostgreSQL database
(heartbeat every 0.5 s, health-check threshold 3 s) run the two tickers of
``ticker_defs.py``; every event a ticker stores names the process that
fired it, so what the store holds shows who ran each ticker when.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.scaling.conftest import Cluster, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(60)]

DEFS = Path(__file__).with_name("ticker_defs.py")
THRESHOLD = 3.0


def ticks(cluster: Cluster) -> dict[str, list[dict[str, Any]]]:
    """Each ticker's stored events, in the order it fired them."""
    by_label: dict[str, list[dict[str, Any]]] = {"a": [], "b": []}
    for event in cluster.json("events", "list", "--limit", "100000"):
        by_label[event["payload"]["label"]].append(event["payload"])
    for events in by_label.values():
        events.sort(key=lambda tick: float(tick["at"]))
    return by_label


def owners(events: list[dict[str, Any]]) -> list[int]:
    """The processes that ran a ticker, in order, each run of consecutive events once."""
    runs: list[int] = []
    for tick in events:
        if not runs or runs[-1] != tick["pid"]:
            runs.append(tick["pid"])
    return runs


def test_a_standalone_trigger_is_taken_over_once_its_owner_is_dead_never_run_twice(
    postgres_database: str, cluster_factory: Callable[..., Cluster],
) -> None:
    cluster = cluster_factory(postgres_database)
    first = cluster.start(0, DEFS)
    wait_until(lambda: all(len(t) >= 5 for t in ticks(cluster).values()), 20,
               "the first triggerer running both tickers")
    standby = [cluster.start(1, DEFS), cluster.start(2, DEFS)]
    wait_until(lambda: len(cluster.json("triggerers", "list")) == 3, 20, "three triggerers")
    time.sleep(1.5)  # three heartbeats: the standbys took nothing while the owner is alive
    assert {owner for t in ticks(cluster).values() for owner in owners(t)} == {first.pid}
    listed = {row["pid"]: row for row in cluster.json("triggerers", "list")}
    assert len(listed[first.pid]["triggers"]) == 2
    assert all(listed[p.pid]["triggers"] == [] and listed[p.pid]["alive"] for p in standby)

    first.send_signal(signal.SIGKILL)
    killed_at = time.time()
    first.wait(timeout=10)
    wait_until(lambda: all(set(owners(t)) - {first.pid} for t in ticks(cluster).values()),
               THRESHOLD + 10, "both tickers taken over")
    taken = ticks(cluster)
    takeover = {label: min(float(t["at"]) for t in events if t["pid"] != first.pid) - killed_at
                for label, events in taken.items()}
    print(f"\nstandalone takeover after SIGKILL (threshold {THRESHOLD} s, heartbeat 0.5 s): "
          + ", ".join(f"ticker {label} {seconds:.2f} s" for label, seconds in takeover.items()))
    assert all(THRESHOLD - 0.5 < seconds < THRESHOLD + 3 for seconds in takeover.values())
    for events in taken.values():
        assert len(owners(events)) == 2  # the dead owner, then one survivor: no interleaving
    trigger_ids = sorted(t["id"] for t in cluster.json("triggers", "list"))

    def standbys_list_them() -> bool:
        # `triggerers list` shows what each one reported at its last heartbeat (every
        # 0.5 s here): a taken-over ticker can tick before its new owner's next heartbeat.
        rows = {row["pid"]: row for row in cluster.json("triggerers", "list")}
        return sorted(t for p in standby for t in rows[p.pid]["triggers"]) == trigger_ids

    wait_until(standbys_list_them, 5, "the survivors listing the tickers they took over")
    listed = {row["pid"]: row for row in cluster.json("triggerers", "list")}
    assert listed[first.pid]["alive"] is False
    assert sorted(t for p in standby for t in listed[p.pid]["triggers"]) == trigger_ids

    # A clean stop hands its tickers back at once: the other takes them within a heartbeat
    # or two, not after the threshold, and again nothing runs twice.
    holder, other = sorted(standby, key=lambda p: -len(listed[p.pid]["triggers"]))
    holder.send_signal(signal.SIGTERM)
    stopped_at = time.time()
    assert holder.wait(timeout=30) == 0
    wait_until(lambda: all(owners(t)[-1] == other.pid for t in ticks(cluster).values()), 10,
               "the released tickers running on the last triggerer")
    handover = max(min(float(t["at"]) for t in events if t["pid"] == other.pid and
                       float(t["at"]) > stopped_at - 1)
                   for events in ticks(cluster).values()) - stopped_at
    print(f"handover after SIGTERM: {handover:.2f} s")
    assert handover < THRESHOLD
    for events in ticks(cluster).values():
        runs = owners(events)
        assert len(runs) == len(set(runs))  # each process ran each ticker in one stretch
