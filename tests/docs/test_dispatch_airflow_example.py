"""The Apache Airflow set-up of ``docs/dispatch.md``, step by step, against a real Airflow 3.

The page marks the blocks of its example with ``<!-- airflow-example: ... -->``:
the DAG file (``dag NAME``), the target's configuration (``config``) and the
definitions (``definitions``). This test puts the DAG file in the kit's
Airflow's DAGs folder, appends the configuration to a new
``sharedstream.toml``, gives the triggerer the connection as the page says
(``AIRFLOW_CONN_AIRFLOW_DEFAULT``), runs the definitions in a real
triggerer, sends two orders and checks what the page promises: one Airflow
run of ``ship`` per order, with the order in its conf, run to success, and
our runs followed there to ``success``, with Airflow's run id and link.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest

from sharedstream.runtime.config import load_config, write_default_config
from sharedstream.runtime.crypto import generate_key
from sharedstream.runtime.definitions import load_definitions
from sharedstream.runtime.triggerer import Triggerer
from sharedstream.testing.airflow import AirflowServer
from sharedstream.testing.memory_broker import MemoryBroker

pytestmark = [pytest.mark.airflow, pytest.mark.timeout(180)]

PAGE = Path(__file__).resolve().parents[2] / "docs" / "dispatch.md"
_BLOCK = re.compile(r"<!-- airflow-example: (?P<what>[\w.]+)(?: (?P<name>[\w.]+))? -->\n"
                    r"```\w*\n(?P<body>.*?)```", re.DOTALL)


def blocks() -> dict[str, tuple[str | None, str]]:
    """``what -> (name, body)`` of the page's marked blocks."""
    found = {m["what"]: (m["name"], m["body"]) for m in _BLOCK.finditer(PAGE.read_text())}
    assert set(found) == {"dag", "config", "definitions"}, sorted(found)
    return found


async def test_the_pages_airflow_example_runs_orders_in_airflow(
        airflow_server: AirflowServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    example = blocks()
    dag_name, dag_file = example["dag"]
    assert dag_name is not None
    (airflow_server.dags_folder / dag_name).write_text(dag_file)
    await asyncio.to_thread(airflow_server.wait_for_dag, "ship")
    monkeypatch.setenv("AIRFLOW_CONN_AIRFLOW_DEFAULT", airflow_server.connection_uri())
    path = tmp_path / "sharedstream.toml"
    write_default_config(path, kwargs_key=generate_key(), store_url="sqlite:///store.db")
    with path.open("a") as handle:
        handle.write("\n" + example["config"][1])
    (tmp_path / "defs.py").write_text(example["definitions"][1])
    config = load_config(path, environ={"SHAREDSTREAM__DISPATCH__FOLLOW_INTERVAL": "1"})
    with config.store.open_store(create=True) as store:
        store.migrate()
    triggerer = Triggerer(config, load_definitions(tmp_path / "defs.py"))
    running = asyncio.create_task(triggerer.run())
    try:
        MemoryBroker.named("docs-airflow").produce("orders", [b"order-1", b"order-2"])
        for _ in range(600):
            await asyncio.sleep(0.2)
            if {r.state for r in await asyncio.to_thread(
                    triggerer.store.list_runs, dag_id="ship")} == {"success"}:
                break
    finally:
        triggerer.request_stop()
        assert await running == 0
        MemoryBroker.forget("docs-airflow")
    with config.store.open_store() as store:
        ours = store.list_runs(dag_id="ship")
    assert [r.state for r in ours] == ["success", "success"]
    theirs = {run["dag_run_id"]: run for run in airflow_server.dag_runs("ship")}
    assert len(theirs) == 2
    for row in ours:
        assert row.external_id in theirs
        assert row.external_url is not None
        assert row.external_url.endswith(f"/dags/ship/runs/{row.external_id}")
        run = theirs[row.external_id]
        assert run["state"] == "success"
        [event] = run["conf"]["sharedstream"]["events"]
        assert event["payload"]["value"] in ("order-1", "order-2")
