"""Queued runs *run*: the local target end to end, through the real CLI, on real SQLite files.

``process_orders`` runs ``run_job.py`` per run (``FILELOG_RUN``); it records
each run it gets in ``runs.jsonl``. The other DAGs name no target: their
runs wait in the store.
"""

from __future__ import annotations

import json
import signal
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.runtime.conftest import Deployment, wait_for

RUN_JOB = Path(__file__).with_name("run_job.py")
ORDERS = [{"kind": "order", "amount": 50}, {"kind": "refund", "amount": 10},
          {"kind": "order", "amount": 150}, {"kind": "order", "amount": 7}]
# orders gets 4 asset events (the big order is seen by two watchers): 4 process_orders runs
RUNS = 4


def runs_locally(d: Deployment, **env: str) -> Path:
    """Give ``process_orders`` its command; the file its runs are recorded in."""
    ran = d.dir / "runs.jsonl"
    d.env |= {"FILELOG_RUN": json.dumps([sys.executable, str(RUN_JOB)]), "RUN_LOG": str(ran),
              "SHAREDSTREAM__DISPATCH__POLL_INTERVAL": "0.2", **env}
    return ran


def ran(path: Path) -> Counter[str]:
    """How many times each run id was run."""
    if not path.exists():
        return Counter()
    return Counter(json.loads(line)["run_id"] for line in path.read_text().splitlines())


def states(d: Deployment, dag: str = "process_orders") -> Counter[str]:
    return Counter(r["state"] for r in d.json("runs", "list", "--dag", dag, "--limit", "100000"))


def test_each_run_runs_once_and_the_others_wait(deployment: Deployment) -> None:
    d = deployment
    log = runs_locally(d)
    d.append(*ORDERS)
    proc = d.start()
    wait_for(lambda: states(d) == {"success": RUNS}, what="every run succeeded")
    assert sorted(ran(log).values()) == [1] * RUNS
    runs = d.json("runs", "list", "--dag", "process_orders")
    assert {(r["target"], r["attempts"], r["last_error"]) for r in runs} == {("local", 1, None)}
    assert all(r["dispatched_at"] and r["ended_at"] for r in runs)
    shown = d.json("runs", "show", "process_orders", runs[0]["run_id"])
    [attempt] = shown["attempt_log"]
    assert (attempt["outcome"], attempt["target"]) == ("success", "local")
    assert "processed orders [" in attempt["output"]
    assert [e["payload"]["kind"] for e in shown["events"]] == ["order"]
    assert states(d, "either") == {"queued": RUNS + 1}  # no target: they wait
    assert "this DAG's runs wait in the store dag=either" in d.stderr()
    text = d.cli("runs", "show", "process_orders", runs[0]["run_id"]).stdout
    assert "state:          success" in text
    assert "output of attempt 1 (its end):" in text
    assert d.stop(proc) == 0


def test_a_failed_run_is_recorded_and_retried_by_hand(deployment: Deployment) -> None:
    d = deployment
    fixed = d.dir / "fixed"
    log = runs_locally(d, RUN_FAIL_IDS="2", RUN_FIXED=str(fixed))
    d.append(*ORDERS)
    proc = d.start()
    wait_for(lambda: states(d) == {"success": 2, "failed": 2}, what="order 2's runs failed")
    failed = d.json("runs", "list", "--dag", "process_orders", "--state", "failed")
    assert {r["last_error"] for r in failed} == {"exit status 3: order 2 cannot be processed"}
    nothing = d.cli("runs", "retry", "process_orders", check=False)
    assert nothing.returncode == 2
    assert "give the RUN_IDs to retry, or --state" in nothing.stderr
    fixed.touch()
    out = d.cli("runs", "retry", "process_orders", "--state", "failed").stdout
    assert out.startswith("queued 2 runs of process_orders again")
    wait_for(lambda: states(d) == {"success": RUNS}, what="the retried runs succeeded")
    for run in failed:
        assert ran(log)[run["run_id"]] == 2
        shown = d.json("runs", "show", "process_orders", run["run_id"])
        assert [a["outcome"] for a in shown["attempt_log"]] == ["failed", "success"]
    assert d.stop(proc) == 0


def test_manual_runs_pause_and_unpause(deployment: Deployment) -> None:
    d = deployment
    log = runs_locally(d)
    proc = d.start()
    wait_for(lambda: "dispatching DAG runs" in d.stderr(), what="the dispatcher")
    out = d.cli("dags", "trigger", "process_orders", "--conf", '{"why": "a test"}',
                "--run-id", "manual__one").stdout
    assert out.startswith("queued process_orders manual__one")
    wait_for(lambda: states(d) == {"success": 1}, what="the manual run ran")
    [manual] = d.json("runs", "list", "--dag", "process_orders")
    assert (manual["run_type"], manual["conf"]) == ("manual", {"why": "a test"})
    again = d.cli("dags", "trigger", "process_orders", "--run-id", "manual__one", check=False)
    assert again.returncode == 2
    assert "already has a run 'manual__one'" in again.stderr
    bad = d.cli("dags", "trigger", "process_orders", "--conf", "[1]", check=False)
    assert (bad.returncode, bad.stderr.strip()) == (
        2, "sharedstream: error: --conf must be a JSON object, got list")

    assert d.cli("dags", "pause", "process_orders").stdout.startswith("process_orders: paused")
    d.append({"kind": "order", "amount": 1})
    wait_for(lambda: states(d) == {"success": 1, "queued": 1}, what="the new run queued")
    time.sleep(1.0)  # several claim rounds (poll_interval 0.2 s): it stays queued
    assert states(d) == {"success": 1, "queued": 1}
    d.cli("dags", "unpause", "process_orders")
    wait_for(lambda: states(d) == {"success": 2}, what="the paused run ran once unpaused")
    assert len(ran(log)) == 2
    assert d.stop(proc) == 0


@pytest.mark.slow  # over 6 s: the slow CI step (keeps the default run under 15 minutes)
@pytest.mark.timeout(180)
def test_sigkill_mid_dispatch_runs_every_run_repeating_at_most_those_unrecorded(
        deployment: Deployment) -> None:
    d = deployment
    with d.config.open("a") as config:
        config.write("\n[targets.local]\nmax_concurrency = 2\n")
    log = runs_locally(d, RUN_SLEEP="0.05")
    total = 120
    d.append(*[{"kind": "order", "amount": n % 100} for n in range(total)])  # none big
    first = d.start()
    wait_for(lambda: len(ran(log)) >= 25, timeout=60, what="some runs ran")
    assert d.stop(first, signal.SIGKILL) == -signal.SIGKILL
    before = ran(log)
    assert len(before) < total, "everything ran before the kill"
    second = d.start()
    wait_for(lambda: states(d) == {"success": total}, timeout=120, what="every run succeeded")
    assert d.stop(second) == 0
    counts = ran(log)
    assert len(counts) == total  # every run ran
    repeated = [run for run, n in counts.items() if n > 1]
    assert all(counts[run] == 2 for run in repeated)
    # Only those whose outcome the kill left unrecorded: under way (max_concurrency 2), or
    # ended within the last results batch (flush_interval 0.02 s < a run's 0.05 s): at most 4.
    assert len(repeated) <= 4
    for run in repeated:
        attempts = d.json("runs", "show", "process_orders", run)["attempt_log"]
        assert [a["outcome"] for a in attempts] == ["unknown", "success"]


def test_batched_runs_consume_the_queue_in_bounded_batches(deployment: Deployment) -> None:
    d = deployment
    log = runs_locally(d, FILELOG_DAG=json.dumps({"max_events": 2, "max_wait": 1.0}))
    d.append(*[{"kind": "order", "amount": n} for n in range(5)])  # five events, none big
    proc = d.start()
    wait_for(lambda: states(d) == {"success": 3}, what="three batched runs")
    runs = [json.loads(line) for line in log.read_text().splitlines()]
    assert sorted(run["ids"] for run in runs) == [[0, 1], [2, 3], [4]]  # the last by max_wait
    [dag] = [row for row in d.json("dags", "list") if row["dag_id"] == "process_orders"]
    assert (dag["target"], dag["paused"], dag["batching"]) == (
        "local", False, {"max_events": 2, "max_wait": 1.0})
    assert d.stop(proc) == 0
