"""``Dag(schedule=<time>)`` in definitions: what a cron string, a delta or a timetable becomes,
the start/end date and catchup checks, and the timetables a definitions file may store."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from sharedstream.runtime.definitions import Asset, Dag, DefinitionsError, load_definitions
from sharedstream.timetables.assets import AssetOrTimeSchedule
from sharedstream.timetables.trigger import CronTriggerTimetable, DeltaTriggerTimetable

START = datetime(2026, 1, 1, tzinfo=UTC)

HEADER = """
from datetime import UTC, datetime, timedelta
from sharedstream.definitions import Asset, AssetWatcher, Dag
from sharedstream.timetables.base import DagRunInfo, Timetable
"""


def write(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "time_defs.py"
    path.write_text(HEADER + body)
    return path


def test_a_cron_string_is_a_cron_trigger_in_the_start_dates_timezone() -> None:
    paris = datetime(2026, 3, 1, tzinfo=ZoneInfo("Europe/Paris"))
    dag = Dag("nightly", schedule="0 2 * * *", start_date=paris)
    assert isinstance(dag.timetable, CronTriggerTimetable)
    assert dag.timetable.serialize()["timezone"] == "Europe/Paris"
    assert dag.schedule is dag.timetable
    assert dag.asset_condition is None
    assert (dag.start_date, dag.end_date, dag.catchup) == (paris, None, False)
    assert Dag("utc", schedule="@hourly").timetable.serialize()["timezone"] == "UTC"  # type: ignore[union-attr]


def test_a_delta_is_a_delta_trigger_and_none_schedules_nothing() -> None:
    assert isinstance(Dag("d", schedule=timedelta(minutes=5)).timetable, DeltaTriggerTimetable)
    manual = Dag("m", schedule=None)
    assert (manual.schedule, manual.timetable, manual.asset_condition) == (None, None, None)


def test_asset_or_time_has_both_sides() -> None:
    orders = Asset("orders")
    dag = Dag("both", schedule=AssetOrTimeSchedule(
        timetable=DeltaTriggerTimetable(timedelta(hours=1)), assets=orders))
    assert dag.asset_condition is orders
    assert isinstance(dag.timetable, AssetOrTimeSchedule)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"start_date": datetime(2026, 1, 1)},
     "Dag 'd': start_date 2026-01-01T00:00:00 has no timezone"),
    ({"end_date": datetime(2026, 1, 1)},
     "Dag 'd': end_date 2026-01-01T00:00:00 has no timezone"),
    ({"start_date": "2026-01-01"}, "Dag 'd': start_date must be a datetime"),
    ({"start_date": START, "end_date": START - timedelta(days=1)},
     "Dag 'd': end_date 2025-12-31T00:00:00+00:00 is before start_date"),
    ({"catchup": "yes"}, "Dag 'd': catchup must be True or False"),
    ({"schedule": "not a cron"}, "Dag 'd': "),
    ({"schedule": 42}, "Dag 'd': schedule must be an Asset"),
])
def test_bad_time_schedules_are_one_line_naming_the_dag(
        kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(DefinitionsError) as info:
        Dag("d", **{"schedule": "@daily"} | kwargs)  # type: ignore[arg-type]
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_a_file_of_time_scheduled_dags_alone_loads(tmp_path: Path) -> None:
    defs = load_definitions(write(tmp_path, (
        'Dag("tick", schedule=timedelta(seconds=30), start_date=datetime(2026, 1, 1, tzinfo=UTC),'
        ' catchup=True)\n'
        'Dag("never", schedule=None)\n')))
    assert sorted(defs.dags) == ["never", "tick"]
    assert defs.triggers == {}
    assert list(defs.timetables) == ["tick"]
    assert defs.timetables["tick"]["classpath"] == (
        "sharedstream.timetables.trigger.DeltaTriggerTimetable")


CUSTOM = """
class EveryDay(Timetable):
    def __init__(self, hour=0):
        self.hour = hour
    def serialize(self):
        return {"hour": self.hour}
    @classmethod
    def deserialize(cls, data):
        return cls(data["hour"])
    def next_dagrun_info(self, *, last_automated_data_interval, restriction):
        return None
"""


def test_a_timetable_class_of_the_file_is_registered(tmp_path: Path) -> None:
    defs = load_definitions(write(tmp_path, CUSTOM + 'Dag("custom", schedule=EveryDay(6))\n'))
    (classpath,) = defs.timetable_classes
    assert classpath.endswith(".time_defs.EveryDay")
    assert defs.timetables["custom"] == {"classpath": classpath, "data": {"hour": 6}}


def test_a_timetable_from_an_unregistered_module_is_refused(tmp_path: Path) -> None:
    (tmp_path / "elsewhere_tt.py").write_text(
        "from sharedstream.timetables.base import Timetable\n" + CUSTOM)
    path = write(tmp_path,
                 'from elsewhere_tt import EveryDay\nDag("custom", schedule=EveryDay())\n')
    with pytest.raises(DefinitionsError) as info:
        load_definitions(path)
    text = str(info.value)
    assert f"{path}: Dag 'custom': its timetable EveryDay cannot be stored" in text
    assert "UnregisteredTimetableClass" in text
    assert "\n" not in text


def test_a_timetable_that_does_not_serialize_is_refused(tmp_path: Path) -> None:
    body = CUSTOM + 'Dag("custom", schedule=EveryDay(object()))\n'
    with pytest.raises(DefinitionsError, match=r"Dag 'custom': its timetable EveryDay cannot be "
                       r"stored: InvalidTimetable: .*not JSON-able"):
        load_definitions(write(tmp_path, body))


def test_an_empty_file_is_still_refused(tmp_path: Path) -> None:
    with pytest.raises(DefinitionsError, match="defines no Asset with a watcher and no Dag"):
        load_definitions(write(tmp_path, "x = 1\n"))
