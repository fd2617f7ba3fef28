"""The ``airflow.sdk`` mirror: Airflow's signatures over our definitions, tasks inert.

A definitions file using ``Asset(name=..., uri=...)``, ``with DAG(...)``,
``@dag``, ``@task`` and ``EmptyOperator`` loads through
:func:`~sharedstream.runtime.definitions.load_definitions` into our assets and
DAGs; what concerns running tasks is accepted and never run.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from sharedstream.airflow.providers.standard.operators.empty import EmptyOperator
from sharedstream.airflow.sdk import DAG, Asset, dag, task
from sharedstream.runtime.definitions import Asset as OurAsset
from sharedstream.runtime.definitions import Dag, DefinitionsError, load_definitions

DEFINITIONS = '''
import datetime as dt

from sharedstream.airflow.providers.standard.operators.empty import EmptyOperator
from sharedstream.airflow.sdk import DAG, Asset, AssetWatcher, dag, task
from sharedstream.airflow.triggers.base import BaseEventTrigger, TriggerEvent

ran = []


class Tick(BaseEventTrigger):
    def serialize(self):
        return (f"{type(self).__module__}.Tick", {})

    async def run(self):
        yield TriggerEvent(1)


ticks = Asset(uri="timer://ticks", group="timers", extra={"team": "ops"},
              watchers=[AssetWatcher("tick", trigger=Tick())])

with DAG("nightly", "runs nightly", schedule="0 2 * * *",
         start_date=dt.datetime(2026, 1, 1, tzinfo=dt.UTC), catchup=True, tags=["ops"],
         default_args={"retries": 3}, max_active_runs=1) as nightly:
    EmptyOperator(task_id="a") >> [EmptyOperator(task_id="b"), EmptyOperator(task_id="c")]


@dag(schedule=[ticks], doc_md="on ticks")
def on_ticks():
    @task
    def work(n):
        ran.append(n)

    @task(task_id="other", retries=2)
    def more():
        ran.append("more")

    work(1) >> more()


built = on_ticks()
'''


def test_a_watcher_file_in_airflows_words_loads_into_our_definitions(tmp_path: Path) -> None:
    path = tmp_path / "sdk_defs.py"
    path.write_text(DEFINITIONS)
    definitions = load_definitions(path)
    assert list(definitions.assets) == ["timer://ticks"]
    asset = definitions.assets["timer://ticks"]
    assert isinstance(asset, OurAsset)
    assert isinstance(asset, Asset)  # the mirror's, keeping Airflow's fields
    assert (asset.uri, asset.group, asset.extra) == ("timer://ticks", "timers", {"team": "ops"})
    nightly, on_ticks = definitions.dags["nightly"], definitions.dags["on_ticks"]
    assert isinstance(nightly, Dag)
    assert nightly.timetable is not None
    assert nightly.start_date == dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    assert nightly.catchup is True
    assert on_ticks.asset_condition is not None
    assert [a.name for a in on_ticks.asset_condition.assets()] == ["timer://ticks"]
    module = __import__("sharedstream_definitions.sdk_defs", fromlist=["ran", "built"])
    assert module.ran == []  # no task body ran
    assert module.built is on_ticks


def test_asset_needs_a_name_or_a_uri_and_each_stands_for_the_other() -> None:
    with pytest.raises(DefinitionsError, match="Asset needs a name or a uri"):
        Asset()
    named = Asset("orders")
    assert (named.name, named.uri) == ("orders", "orders")
    both = Asset(name="orders", uri="s3://b/orders")
    assert (both.name, both.uri) == ("orders", "s3://b/orders")


def test_dag_refuses_an_argument_airflow_does_not_have() -> None:
    with pytest.raises(TypeError, match="unexpected arguments schedule_interval"):
        DAG("old", schedule=None, schedule_interval="@daily")


def test_dag_decorator_takes_its_id_from_the_function_or_the_argument() -> None:
    @dag(schedule=None)
    def named_after_me() -> None:
        pass

    @dag("given", schedule=None)
    def not_this() -> None:
        pass

    @dag
    def bare() -> None:
        pass

    assert named_after_me().dag_id == "named_after_me"
    assert not_this().dag_id == "given"
    assert bare().dag_id == "bare"


def test_tasks_are_inert_and_chain() -> None:
    @task
    def boom() -> None:
        raise AssertionError("a task body ran")

    first, last = boom(), EmptyOperator(task_id="end")
    assert (first >> last) is last
    assert ([first] >> last) is last
    assert (last << first) is first
    assert first.task_id == "boom"
    assert repr(last) == "EmptyOperator(task_id='end')"
