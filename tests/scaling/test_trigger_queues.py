"""Trigger queues: each triggerer on one PostgreSQL runs the triggers of its queues, and only those.

Three real ``sharedstream triggerer`` processes share one database and the
definitions of ``queue_defs.py``: one configured with ``[triggerer] queues =
team-a``, one with ``team-b``, one with none. Each ticker's events name the
process that fired it. When team a's triggerer dies, its ticker waits for
another team-a triggerer: the others, alive and with room, never take it.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.scaling.conftest import Cluster, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(90)]

DEFS = Path(__file__).with_name("queue_defs.py")
THRESHOLD = 3.0
QUEUES = "SHAREDSTREAM__TRIGGERER__QUEUES"


def firing(cluster: Cluster) -> dict[str, list[tuple[float, int]]]:
    """Each ticker's events as ``(at, pid)``, in the order fired."""
    found: dict[str, list[tuple[float, int]]] = {"a": [], "b": [], "c": []}
    for event in cluster.json("events", "list", "--limit", "100000"):
        found[event["payload"]["label"]].append((event["payload"]["at"], event["payload"]["pid"]))
    return {label: sorted(events) for label, events in found.items()}


def test_each_triggerer_runs_its_queues_triggers_and_a_queue_waits_for_its_own(
    postgres_database: str, cluster_factory: Callable[..., Cluster],
) -> None:
    cluster = cluster_factory(postgres_database)
    team_a = cluster.start(0, DEFS, env={QUEUES: "team-a"})
    team_b = cluster.start(1, DEFS, env={QUEUES: "team-b, spare"})
    default = cluster.start(2, DEFS)
    wait_until(lambda: all(len(events) >= 5 for events in firing(cluster).values()), 30,
               "every ticker firing")
    pids = {label: {pid for _, pid in events} for label, events in firing(cluster).items()}
    assert pids == {"a": {team_a.pid}, "b": {team_b.pid}, "c": {default.pid}}
    assert "triggers of other trigger queues are left to their triggerers" in cluster.log(2)

    team_a.send_signal(signal.SIGKILL)
    team_a.wait(timeout=10)
    killed_at = time.time()
    time.sleep(THRESHOLD + 2)  # past the threshold: a triggerer of its queue would take it
    assert all(at < killed_at for at, _ in firing(cluster)["a"])
    assert team_b.poll() is None
    assert default.poll() is None

    relief = cluster.start(3, DEFS, env={QUEUES: "team-a"})
    wait_until(lambda: any(pid == relief.pid for _, pid in firing(cluster)["a"]), 20,
               "the new team-a triggerer taking ticker a")
    latest = firing(cluster)
    assert {pid for at, pid in latest["a"] if at > killed_at} == {relief.pid}
    assert {pid for _, pid in latest["b"]} == {team_b.pid}
    assert {pid for _, pid in latest["c"]} == {default.pid}
