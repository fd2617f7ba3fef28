"""Two triggerers on one PostgreSQL dispatch the same DAG's runs: each run once, and a killed
triggerer's runs whose outcome it had not recorded are recovered by the other.

The standalone ticker of ``ticker_defs.py`` makes an ``on_tick`` run every 0.1 s;
``run_job.py`` runs each (0.4 s) on the local target and records which triggerer ran it:
3 at a time, fewer than the ticker makes, so neither triggerer keeps up alone and both run some.
"""

from __future__ import annotations

import json
import signal
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.scaling.conftest import Cluster, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

DEFS = Path(__file__).with_name("ticker_defs.py")
RUN_JOB = Path(__file__).resolve().parents[1] / "runtime" / "run_job.py"
CONCURRENCY = 3


def ran(log: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def ran_by(row: dict[str, Any], first: int, second: int) -> int:
    """The triggerer that started ``row``'s job: the job's parent when it looked.

    A job the first triggerer started just before its SIGKILL can look only
    after the kill (its interpreter starts slowly on a loaded machine): it is
    an orphan by then, re-parented to init or a subreaper, and records that
    pid. The second triggerer lives to the end, so any other pid is the first.
    """
    return second if row["by"] == second else first


def test_each_run_is_dispatched_once_and_a_dead_triggerers_are_recovered(
    postgres_database: str, cluster_factory: Callable[..., Cluster], tmp_path: Path,
) -> None:
    log = tmp_path / "runs.jsonl"
    cluster = cluster_factory(
        postgres_database, TICKER_RUN=json.dumps([sys.executable, str(RUN_JOB)]),
        RUN_LOG=str(log), RUN_SLEEP="0.4", SHAREDSTREAM__DISPATCH__POLL_INTERVAL="0.1")
    with cluster.config.open("a") as config:
        config.write(f"\n[targets.local]\nmax_concurrency = {CONCURRENCY}\n")
    first, second = cluster.start(0, DEFS), cluster.start(1, DEFS)
    wait_until(lambda: {row["by"] for row in ran(log)} >= {first.pid, second.pid}, 40,
               "both triggerers running runs")
    assert max(Counter(row["run_id"] for row in ran(log)).values()) == 1

    first.send_signal(signal.SIGKILL)
    first.wait(timeout=10)
    killed_at = len(ran(log))

    def runs() -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = cluster.json("runs", "list", "--dag", "on_tick",
                                                    "--limit", "100000")
        return found

    before = {r["run_id"] for r in runs()}  # the dead one's claims among them

    def settled() -> bool:  # every run made before the kill ran, none is left with the dead one
        return all(r["state"] == "success" for r in runs() if r["run_id"] in before)

    wait_until(settled, 30, "the dead triggerer's runs recovered")
    second.send_signal(signal.SIGTERM)
    assert second.wait(timeout=60) == 0
    counts = Counter(row["run_id"] for row in ran(log))
    repeated = {run: n for run, n in counts.items() if n > 1}
    assert all(n == 2 for n in repeated.values())
    # only what the killed one left unrecorded: under way, or ended in its last results batch
    assert len(repeated) <= 2 * CONCURRENCY
    for run in repeated:
        attempts = [row for row in ran(log) if row["run_id"] == run]
        assert [ran_by(row, first.pid, second.pid) for row in attempts] == [first.pid, second.pid]
    unfinished = [r for r in cluster.json("runs", "list", "--dag", "on_tick", "--limit",
                                          "100000") if r["state"] in ("dispatching", "running")]
    assert unfinished == []  # a graceful stop finishes what it started
    print(f"\n{len(counts)} runs, {killed_at} before the kill; repeated after it: "
          f"{len(repeated)}")
