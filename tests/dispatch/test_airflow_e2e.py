"""Messages to Airflow DAG runs, end to end: the real triggerer CLI, a real Apache Airflow 3.

Orders appended to the file-backed log of ``tests/runtime/filelog_defs.py``
queue ``process_orders`` runs whose target is the testing kit's Airflow
(``[targets.airflow]``, its connection in ``AIRFLOW_CONN_AIRFLOW_E2E``). While
the runs are dispatched, Airflow's API server is restarted and the triggerer
is killed with SIGKILL and started again. In the end every order made exactly
one Airflow run, with its event in the conf, whose task ran, and our store
followed each run to ``success``.

Airflow's own tasks report to its API server, so a task under way while it
restarts can fail (seen in about one run in two of this test): the DAG
retries its task, as a DAG in production would, so a run may hold a second
try of its one task.
"""

from __future__ import annotations

import json
import signal
from collections import Counter
from pathlib import Path

import pytest

from sharedstream.testing.airflow import AirflowServer
from tests.runtime.conftest import Deployment, wait_for

pytestmark = [pytest.mark.airflow, pytest.mark.timeout(420)]

DAG_ID = "ss_e2e_orders"
ORDERS = 24
DAG_FILE = '''
import datetime
import json
import pathlib

from airflow.sdk import dag, get_current_context, task


@dag(dag_id={dag_id!r}, schedule=None, max_active_runs=4,
     default_args={{"retries": 2, "retry_delay": datetime.timedelta(seconds=1)}})
def e2e_orders():
    @task
    def record():
        run = get_current_context()["dag_run"]
        with open(pathlib.Path({out!r}), "a") as lines:
            lines.write(json.dumps({{"run_id": run.run_id, "conf": run.conf}}) + "\\n")

    record()


e2e_orders()
'''


def our_states(d: Deployment) -> Counter[str]:
    return Counter(r["state"] for r in d.json("runs", "list", "--dag", "process_orders",
                                                "--limit", "1000"))


def test_every_order_makes_one_airflow_run_through_a_restart_and_a_kill(
        airflow_server: AirflowServer, tmp_path: Path) -> None:
    executions = tmp_path / "executions.jsonl"
    (airflow_server.dags_folder / f"{DAG_ID}.py").write_text(
        DAG_FILE.format(dag_id=DAG_ID, out=str(executions)))
    airflow_server.wait_for_dag(DAG_ID)
    (tmp_path / "shop").mkdir()
    d = Deployment(tmp_path / "shop")
    d.cli("init", "--path", str(d.config))
    with d.config.open("a") as config:
        config.write('\n[targets.airflow]\ntype = "airflow"\nconn_id = "airflow_e2e"\n'
                     "retry_backoff_initial = 0.5\nretry_backoff_max = 2\nmax_attempts = 100\n")
    d.env |= {"AIRFLOW_CONN_AIRFLOW_E2E": airflow_server.connection_uri(),
              "FILELOG_DAG": json.dumps({"target": "airflow",
                                         "target_options": {"dag_id": DAG_ID}}),
              "SHAREDSTREAM__DISPATCH__FOLLOW_INTERVAL": "1",
              "SHAREDSTREAM__DISPATCH__POLL_INTERVAL": "0.2"}
    d.append(*[{"kind": "order", "amount": n} for n in range(ORDERS)])  # none big: 1 run each

    first = d.start()
    wait_for(lambda: sum(n for s, n in our_states(d).items() if s != "queued") >= 4,
             timeout=60, what="the first runs sent to Airflow")
    airflow_server.restart_api_server()  # deliveries meanwhile fail, and are retried
    wait_for(lambda: sum(n for s, n in our_states(d).items()
                         if s not in ("queued", "dispatching")) >= 10,
             timeout=90, what="more runs in Airflow after its restart")
    assert d.stop(first, signal.SIGKILL) == -signal.SIGKILL
    second = d.start()
    try:
        wait_for(lambda: our_states(d) == {"success": ORDERS}, timeout=240,
                 what="every run followed to success in Airflow")
    except AssertionError as exc:  # say where they stand: ours, and Airflow's
        states = Counter(run["state"] for run in airflow_server.dag_runs(DAG_ID))
        raise AssertionError(f"{exc}; ours: {dict(our_states(d))}; Airflow's: {dict(states)}; "
                             f"Airflow restarted: {airflow_server.restarts}") from exc
    assert d.stop(second) == 0

    ours = {r["run_id"]: r for r in d.json("runs", "list", "--dag", "process_orders")}
    theirs = airflow_server.dag_runs(DAG_ID)
    assert len(theirs) == ORDERS  # one Airflow run per order, none twice
    assert all(run["state"] == "success" for run in theirs)
    by_id = {run["dag_run_id"]: run for run in theirs}
    for run_id, row in ours.items():
        assert row["external_id"] in by_id, (run_id, row)
        [event] = by_id[row["external_id"]]["conf"]["sharedstream"]["events"]
        assert event["payload"]["kind"] == "order"
    ran = [json.loads(line) for line in executions.read_text().splitlines()]
    tries = Counter(line["run_id"] for line in ran)
    assert set(tries) == {run["dag_run_id"] for run in theirs}  # every run's task ran
    assert max(tries.values()) <= 3  # once, or again by the DAG's retries
    ids = {line["conf"]["sharedstream"]["events"][0]["payload"]["id"] for line in ran}
    assert ids == set(range(ORDERS))  # each order's event reached its task
