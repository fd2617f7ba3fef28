"""Definitions files: what they declare, and one clear error for each way they go wrong."""

from __future__ import annotations

import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from sharedstream.runtime.definitions import (
    Asset,
    AssetAll,
    AssetAny,
    Dag,
    DefinitionsError,
    load_definitions,
)
from sharedstream.runtime.registry import TriggerRegistry, UnregisteredTriggerClass
from sharedstream.timetables.assets import AssetTriggeredTimetable
from sharedstream.timetables.values import InvalidTimetable

HEADER = '''
from sharedstream import BaseEventTrigger, TriggerEvent
from sharedstream.definitions import Asset, AssetWatcher, Dag

class Watch(BaseEventTrigger):
    def __init__(self, topic, extra=None):
        super().__init__()
        self.topic, self.extra = topic, extra
    def serialize(self):
        return (f"{type(self).__module__}.{type(self).__qualname__}",
                {"topic": self.topic, "extra": self.extra})
    async def run(self):
        yield TriggerEvent(None)
'''


def write(tmp_path: Path, body: str, name: str = "defs.py") -> Path:
    path = tmp_path / name
    path.write_text(HEADER + body)
    return path


def _tree(dag: Dag) -> dict[str, Any]:
    assert dag.asset_condition is not None
    assert dag.schedule is dag.asset_condition
    return dag.asset_condition.to_tree()


def test_schedules_compile_to_trees() -> None:
    a, b, c = Asset("a"), Asset("b"), Asset("c")
    assert _tree(Dag("d", schedule=a)) == {"asset": "a"}
    assert _tree(Dag("d", schedule=[a, b])) == {
        "all": [{"asset": "a"}, {"asset": "b"}]
    }
    assert (a | b | c).to_tree() == {"any": [{"asset": "a"}, {"asset": "b"}, {"asset": "c"}]}
    tree = ((a & b) | c).to_tree()
    assert tree == {"any": [{"all": [{"asset": "a"}, {"asset": "b"}]}, {"asset": "c"}]}
    assert isinstance(a & b, AssetAll)
    assert isinstance(a | b, AssetAny)


def test_load_collects_assets_dags_and_collapses_identical_triggers(tmp_path: Path) -> None:
    path = write(tmp_path, '''
orders = Asset("orders", watchers=[AssetWatcher("w1", trigger=Watch("t")),
                                   AssetWatcher("w2", trigger=Watch("t"))])
audit = Asset("audit", watchers=[AssetWatcher("w3", trigger=Watch("t")),
                                 AssetWatcher("w4", trigger=Watch("u"))])
Dag("both", schedule=orders & audit)
dag = Dag("one", schedule=orders)
''')
    defs = load_definitions(path)
    assert sorted(defs.assets) == ["audit", "orders"]
    assert sorted(defs.dags) == ["both", "one"]  # unassigned Dags count too
    assert len(defs.triggers) == 2
    shared = next(t for t in defs.triggers.values() if t.kwargs["topic"] == "t")
    assert shared.watchers == [("orders", "w1"), ("orders", "w2"), ("audit", "w3")]
    assert shared.classpath in defs.trigger_classes


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ('a = Asset("a", watchers=[AssetWatcher("w", trigger=Watch("t"))])\n'
         'Dag("d", schedule=Asset("x"))',
         "Dag 'd' is scheduled on asset 'x', which no watcher in this file feeds"),
        ('a = Asset("a", watchers=[AssetWatcher("w", trigger=Watch("t"))])\n'
         'Dag("d", schedule=a)\nDag("d", schedule=a)',
         "Dag id 'd' is used twice"),
        ('x = 1', "defines no Asset with a watcher and no Dag"),
        ('a = Asset("a", watchers=[AssetWatcher("w", trigger=Watch("t", extra=object()))])',
         "watcher 'w' of asset 'a': trigger cannot be serialized"),
        ('a = Asset("a", watchers=[AssetWatcher("w", trigger="nope")])',
         "trigger must be a BaseEventTrigger"),
        ('a = Asset("a", watchers=[AssetWatcher("w", trigger=Watch("t")),'
         ' AssetWatcher("w", trigger=Watch("u"))])',
         "watcher name is used twice"),
        ('raise KeyError("boom")', "failed to import (line 14): KeyError: 'boom'"),
        ('d = Dag("d", schedule=[])', "schedule must be an Asset"),
    ],
)
def test_bad_definitions_name_file_object_and_reason(
    tmp_path: Path, body: str, message: str
) -> None:
    path = write(tmp_path, body)
    with pytest.raises(DefinitionsError) as info:
        load_definitions(path)
    assert str(path) in str(info.value) or "schedule must be" in str(info.value)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(DefinitionsError, match="definitions file not found"):
        load_definitions(tmp_path / "nope.py")


def test_registry_rebuilds_only_registered_classes(tmp_path: Path) -> None:
    marker = tmp_path / "imported"
    plugin = tmp_path / "evil_plugin_for_test.py"
    plugin.write_text(f"open({str(marker)!r}, 'w').close()\nclass Evil: pass\n")
    sys.path.insert(0, str(tmp_path))
    try:
        registry = TriggerRegistry()
        registry.load_entry_points()
        with pytest.raises(UnregisteredTriggerClass, match="never imported"):
            registry.rehydrate("evil_plugin_for_test.Evil", {})
        assert not marker.exists()
        assert "evil_plugin_for_test" not in sys.modules
        temporal = registry.rehydrate(
            "sharedstream.triggers.temporal.TimeDeltaTrigger", {"delta": timedelta(0)}
        )
        assert type(temporal).__name__ == "TimeDeltaTrigger"
    finally:
        sys.path.remove(str(tmp_path))


def test_a_time_delta_watcher_is_rebuilt_as_the_date_time_it_serializes_to(
        tmp_path: Path) -> None:
    body = """
from datetime import timedelta
from sharedstream.triggers.temporal import TimeDeltaTrigger
Dag("later", schedule=Asset("a", watchers=[AssetWatcher("w", trigger=TimeDeltaTrigger(
    timedelta(minutes=5)))]))
"""
    first = load_definitions(write(tmp_path, body))
    again = load_definitions(write(tmp_path, body, name="again.py"))
    [watched] = first.triggers.values()
    assert watched.classpath == "sharedstream.triggers.temporal.DateTimeTrigger"
    assert watched.pinned
    assert first.triggers.keys() == again.triggers.keys()  # a new moment, the same trigger
    assert watched.kwargs != next(iter(again.triggers.values())).kwargs
    registry = TriggerRegistry()  # as the triggerer builds it: installed, then the file's
    registry.load_entry_points()
    for classpath, cls in first.trigger_classes.items():
        registry.register(classpath, cls)
    rebuilt = registry.rehydrate(watched.classpath, watched.kwargs)
    assert type(rebuilt).__name__ == "DateTimeTrigger"
    assert rebuilt.serialize() == (watched.classpath, watched.kwargs)


def test_every_broker_trigger_is_registered_by_entry_point() -> None:
    """A trigger stored by another definitions file can be rebuilt: each broker's is known."""
    registry = TriggerRegistry()
    registry.load_entry_points()
    for module, name in [("kafka", "KafkaSharedStreamTrigger"), ("sqs", "SqsSharedStreamTrigger"),
                         ("pubsub", "PubSubSharedStreamTrigger"),
                         ("servicebus", "ServiceBusSharedStreamTrigger")]:
        assert f"sharedstream.triggers.{module}.{name}" in registry, name


def test_assets_are_identified_by_name_and_unassigned_dags_count(tmp_path: Path) -> None:
    path = write(tmp_path, '''
Asset("orders", watchers=[AssetWatcher("w1", trigger=Watch("t"))])
Dag("inline", schedule=Asset("orders"))  # neither is assigned to a name
''')
    defs = load_definitions(path)
    assert list(defs.dags) == ["inline"]
    [trigger] = defs.triggers.values()
    assert trigger.watchers == [("orders", "w1")]


def test_modules_beside_the_definitions_file_import_by_name(tmp_path: Path) -> None:
    """As Airflow does for its DAG folder: no PYTHONPATH needed for a sibling module."""
    (tmp_path / "shop_topics.py").write_text('ORDERS = "orders-from-a-sibling"\n')
    path = write(tmp_path, '''
import shop_topics
Asset("orders", watchers=[AssetWatcher("w", trigger=Watch(shop_topics.ORDERS))])
''')
    try:
        defs = load_definitions(path)
    finally:
        sys.modules.pop("shop_topics", None)
    [trigger] = defs.triggers.values()
    assert trigger.kwargs["topic"] == "orders-from-a-sibling"


def test_what_runs_a_dag_and_where_it_goes_are_checked() -> None:
    orders = Asset("orders")

    def ship(run: object) -> None:
        """A run."""

    assert Dag("a", schedule=orders, run=ship).run is ship
    assert Dag("b", schedule=orders, run=("python", "job.py")).run == ["python", "job.py"]
    assert Dag("c", schedule=orders, target="airflow",
               target_options={"mode": "asset_event"}).target_options == {"mode": "asset_event"}
    cases: list[tuple[dict[str, Any], str]] = [
        ({"run": "python job.py"}, "run must be a function .* or a command line"),
        ({"run": []}, "run must be a function"),
        ({"target": ""}, "target must be a target's name"),
        ({"target_options": ["mode"]}, "target_options must be a dict"),
    ]
    for kwargs, message in cases:
        with pytest.raises(DefinitionsError, match=f"Dag 'x': {message}"):
            Dag("x", schedule=orders, **kwargs)


def test_batching_is_checked_and_max_bounds_imply_it() -> None:
    orders = Asset("orders")
    bounded = Dag("a", schedule=orders, max_events=10, max_wait=timedelta(minutes=1))
    assert (bounded.batch_asset_events, bounded.max_events, bounded.max_wait) == (True, 10, 60.0)
    assert Dag("b", schedule=orders).batch_asset_events is None  # the configuration decides
    bad: list[tuple[dict[str, Any], str]] = [
        ({"batch_asset_events": False, "max_events": 5}, "max_events and max_wait bound"),
        ({"max_events": 0}, "max_events must be a whole number >= 1"),
        ({"max_wait": -1}, "max_wait must be a timedelta or seconds >= 0"),
        ({"batch_asset_events": "yes"}, "batch_asset_events must be True, False or None"),
    ]
    for kwargs, message in bad:
        with pytest.raises(DefinitionsError, match=f"Dag 'x': {message}"):
            Dag("x", schedule=orders, **kwargs)
    with pytest.raises(DefinitionsError, match="apply to a DAG scheduled on assets"):
        Dag("x", schedule=timedelta(hours=1), batch_asset_events=True)


def test_an_asset_triggered_timetable_is_its_condition_with_its_batching() -> None:
    orders, stock = Asset("orders"), Asset("stock")
    batched = Dag("a", schedule=AssetTriggeredTimetable(orders | stock, batch_asset_events=True))
    assert batched.asset_condition is not None
    assert batched.asset_condition.to_tree() == (orders | stock).to_tree()
    assert batched.timetable is None
    assert batched.batch_asset_events is True
    both = Dag("b", schedule=AssetTriggeredTimetable([orders, stock]))
    assert _tree(both) == {"all": [{"asset": "orders"}, {"asset": "stock"}]}
    assert both.batch_asset_events is None  # the configuration decides
    assert Dag("c", schedule=AssetTriggeredTimetable(orders),
               batch_asset_events=False).batch_asset_events is False
    with pytest.raises(DefinitionsError, match="Dag 'x': batch_asset_events=False contradicts"):
        Dag("x", schedule=AssetTriggeredTimetable(orders, batch_asset_events=True),
            batch_asset_events=False)
    several = "a condition of several assets .&. needs"
    wrong: list[tuple[Any, dict[str, Any], str]] = [
        (orders & stock, {"batch_asset_events": False}, several),
        (orders | (orders & stock), {"batch_asset_events": False}, several),
        ([], {}, "assets must be an Asset"),
        (orders, {"batch_asset_events": "yes"}, "batch_asset_events must be True, False or None"),
    ]
    for assets, kwargs, message in wrong:
        with pytest.raises(InvalidTimetable, match=f"AssetTriggeredTimetable: {message}"):
            AssetTriggeredTimetable(assets, **kwargs)
    assert AssetTriggeredTimetable(orders | stock, batch_asset_events=False).batch_asset_events \
        is False  # either asset alone satisfies it


def test_a_dag_file_written_for_airflow_3_4_loads_with_its_imports_ported(
        tmp_path: Path) -> None:
    path = write(tmp_path, (
        "from sharedstream.airflow.sdk import DAG, Asset, AssetTriggeredTimetable, AssetWatcher\n"
        "from sharedstream.airflow.timetables.assets import AssetTriggeredTimetable as Same\n"
        "assert Same is AssetTriggeredTimetable\n"
        "orders = Asset('orders', watchers=[AssetWatcher('o', trigger=Watch('orders'))])\n"
        "stock = Asset('stock', watchers=[AssetWatcher('s', trigger=Watch('stock'))])\n"
        "with DAG(dag_id='nightly_orders', schedule=AssetTriggeredTimetable(\n"
        "        orders & stock, batch_asset_events=True)):\n"
        "    pass\n"), "airflow34_defs.py")
    dag = load_definitions(path).dags["nightly_orders"]
    assert _tree(dag) == {"all": [{"asset": "orders"}, {"asset": "stock"}]}
    assert dag.batch_asset_events is True


# -- several files, and folders (issue 31, item 3) ------------------------------------------


def test_several_files_make_one_set_of_definitions(tmp_path: Path) -> None:
    orders = write(tmp_path, 'orders = Asset("orders", watchers=[AssetWatcher("all", '
                   'trigger=Watch("orders"))])\n', "orders_defs.py")
    ship = write(tmp_path, 'Dag("ship", schedule=Asset("orders"))\n'
                 'Asset("orders", watchers=[AssetWatcher("big", trigger=Watch("orders", 1))])\n',
                 "ship_defs.py")
    definitions = load_definitions([orders, ship])
    assert list(definitions.dags) == ["ship"]  # scheduled on an asset another file watches
    assert sorted(w for t in definitions.triggers.values() for w in t.watchers) == [
        ("orders", "all"), ("orders", "big")]
    assert definitions.sources == (orders, ship)
    assert definitions.source == f"{orders}, {ship}"
    assert load_definitions([orders, orders]).sources == (orders, orders)  # read once


def test_a_dag_id_defined_in_two_files_names_both(tmp_path: Path) -> None:
    first = write(tmp_path, 'Dag("ship", schedule="@daily")\n', "first.py")
    second = write(tmp_path, 'Dag("ship", schedule="@hourly")\n', "second.py")
    with pytest.raises(DefinitionsError) as refused:
        load_definitions([first, second])
    assert str(refused.value) == f"{second}: Dag id 'ship' is also defined in {first}"


def test_a_folder_gives_its_files_and_skips_helpers(tmp_path: Path) -> None:
    folder = tmp_path / "dags"
    (folder / "team").mkdir(parents=True)
    write(folder, 'Dag("a", schedule="@daily")\n', "a.py")
    write(folder / "team", 'Dag("b", schedule="@daily")\n', "b.py")
    write(folder, "HELPER = 1\n", "helpers.py")  # declares nothing: a helper module, skipped
    write(folder, "raise RuntimeError('never imported')\n", "_private.py")
    (folder / ".hidden").mkdir()
    write(folder / ".hidden", "raise RuntimeError('never imported')\n", "c.py")
    definitions = load_definitions(folder)
    assert sorted(definitions.dags) == ["a", "b"]
    assert definitions.sources == (folder.resolve(),)


def test_what_a_folder_or_files_cannot_be_is_one_line(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(DefinitionsError, match=r"empty: no definitions file \(\*\.py\)"):
        load_definitions(empty)
    helpers = tmp_path / "helpers"
    helpers.mkdir()
    write(helpers, "HELPER = 1\n", "util.py")
    with pytest.raises(DefinitionsError, match="defines no Asset with a watcher and no Dag"):
        load_definitions(helpers)
    one, two = tmp_path / "x", tmp_path / "y"
    one.mkdir()
    two.mkdir()
    write(one, 'Dag("a", schedule="@daily")\n', "shop.py")
    write(two, 'Dag("b", schedule="@daily")\n', "shop.py")
    with pytest.raises(DefinitionsError, match=r"another definitions file has the name shop\.py"):
        load_definitions([one, two])
    with pytest.raises(DefinitionsError, match="no definitions file given"):
        load_definitions([])
