"""``airflow.sdk``'s ``BaseHook`` and ``Variable`` under the import rule.

Unit tests hold the lookup rules (the environment is the only input); the
last test runs a trigger written for Airflow - it reads its connection
through a hook and a setting through ``Variable.get`` in ``run()`` - in a
real ``sharedstream triggerer``, with the deployment's ``AIRFLOW_CONN_*``
and ``AIRFLOW_VAR_*`` variables.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest

from sharedstream.airflow.sdk import BaseHook, Variable
from sharedstream.connections import ConnectionNotFound
from sharedstream.runtime.variables import VariableNotFound
from tests.airflow.test_provider_watchers import port
from tests.cli import ROOT, TriggererCli


def test_variables_come_from_sharedstreams_then_airflows_environment_form(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AIRFLOW_VAR_REGION", "eu")
    assert Variable.get("region") == "eu"
    monkeypatch.setenv("SHAREDSTREAM_VAR_REGION", "us")
    assert Variable.get("region") == "us"
    monkeypatch.setenv("AIRFLOW_VAR_EMPTY", "")
    assert Variable.get("empty", default="unused") == ""


def test_a_missing_variable_gives_the_default_in_either_spelling_or_a_key_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("AIRFLOW_VAR_ABSENT", raising=False)
    monkeypatch.delenv("SHAREDSTREAM_VAR_ABSENT", raising=False)
    assert Variable.get("absent", "three") == "three"
    assert Variable.get("absent", default=None) is None
    assert Variable.get("absent", default_var=3) == 3
    with pytest.raises(KeyError) as raised:
        Variable.get("absent")
    assert isinstance(raised.value, VariableNotFound)
    assert str(raised.value) == ("variable 'absent' not found: set SHAREDSTREAM_VAR_ABSENT or "
                                 "AIRFLOW_VAR_ABSENT")


def test_json_variables_are_parsed_on_request(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW_VAR_LIMITS", '{"max": 5}')
    assert Variable.get("limits", deserialize_json=True) == {"max": 5}
    assert Variable.get("limits") == '{"max": 5}'
    monkeypatch.setenv("AIRFLOW_VAR_BROKEN", "{nope")
    with pytest.raises(ValueError, match="variable 'broken' is not JSON"):
        Variable.get("broken", deserialize_json=True)


def test_base_hook_reads_our_connections(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_ORDERS_API",
                       "https://svc:s3cret@orders.example:8443/v1?timeout=5")

    class OrdersHook(BaseHook):
        def get_conn(self) -> str:
            conn = self.get_connection("orders_api")
            return f"{conn.host}:{conn.port}/{conn.schema}"

    hook = OrdersHook()
    assert hook.get_conn() == "orders.example:8443/v1"
    conn = BaseHook.get_connection("orders_api")
    assert (conn.login, conn.password, conn.extra_dejson) == ("svc", "s3cret", {"timeout": 5})
    assert hook.log.name.endswith("OrdersHook")
    monkeypatch.delenv("AIRFLOW_CONN_NOWHERE", raising=False)
    with pytest.raises(ConnectionNotFound, match="'nowhere' not found"):
        BaseHook.get_connection("nowhere")
    with pytest.raises(NotImplementedError, match="get_conn"):
        BaseHook().get_conn()


AIRFLOW_DEFS = '''\
import asyncio

from airflow.sdk import DAG, Asset, AssetWatcher, BaseHook, Variable
from airflow.triggers.base import BaseEventTrigger, TriggerEvent


class ApiStatus(BaseEventTrigger):
    """Reads its connection through a hook and a threshold through a variable, in run()."""

    def __init__(self, conn_id):
        super().__init__()
        self.conn_id = conn_id

    def serialize(self):
        return ("mq_hook_defs.ApiStatus", {"conn_id": self.conn_id})

    async def run(self):
        conn = BaseHook.get_connection(self.conn_id)
        yield TriggerEvent({"host": conn.host, "login": conn.login,
                            "threshold": Variable.get("threshold", deserialize_json=True),
                            "missing": Variable.get("not_set", default_var="fallback")})
        await asyncio.Event().wait()


status = Asset("status", watchers=[AssetWatcher("api", trigger=ApiStatus("status_api"))])

with DAG(dag_id="report", schedule=[status]):
    pass
'''


@pytest.mark.timeout(60)
async def test_a_trigger_reading_a_hook_and_a_variable_runs_in_the_triggerer(
    tmp_path: Path,
) -> None:
    definitions = tmp_path / "mq_hook_defs.py"
    definitions.write_text(port(AIRFLOW_DEFS))
    assert "from airflow" not in definitions.read_text()
    env = {**os.environ, "PYTHONPATH": str(ROOT),
           "AIRFLOW_CONN_STATUS_API": "http://watcher:pw@status.example:80",
           "AIRFLOW_VAR_THRESHOLD": "[1, 2]"}
    env.pop("AIRFLOW_VAR_NOT_SET", None)
    env.pop("SHAREDSTREAM_VAR_NOT_SET", None)
    cli = TriggererCli(tmp_path, env, definitions)
    cli.run("init", "--path", str(cli.config))

    async def stored() -> bool:
        listed = await asyncio.to_thread(cli.run, "events", "list", "--json")
        return bool(json.loads(listed))

    with cli.running(0) as process:
        await cli.until(0, process, stored, 30)
    (event,) = json.loads(cli.run("events", "list", "--json"))
    assert event["payload"] == {"host": "status.example", "login": "watcher",
                                "threshold": [1, 2], "missing": "fallback"}
