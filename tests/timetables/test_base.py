"""The timetable contract's values, run ids, ``timetable_for`` and the registry."""

from __future__ import annotations

import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from dateutil.relativedelta import FR, relativedelta

from sharedstream.timetables.base import (
    DagRunInfo,
    DataInterval,
    InvalidTimetable,
    NaiveDatetime,
    TimeRestriction,
    TimetableRegistry,
    UnregisteredTimetableClass,
    deserialize_timetable,
    serialize_timetable,
    use_clock,
    utcnow,
)
from sharedstream.timetables.from_schedule import timetable_for
from sharedstream.timetables.interval import CronDataIntervalTimetable, DeltaDataIntervalTimetable
from sharedstream.timetables.simple import OnceTimetable
from sharedstream.timetables.trigger import CronTriggerTimetable, DeltaTriggerTimetable

AMS = ZoneInfo("Europe/Amsterdam")


def test_dagruninfo_constructors_and_logical_date() -> None:
    start, end = datetime(2026, 1, 5, 9, tzinfo=UTC), datetime(2026, 1, 9, 18, tzinfo=UTC)
    info = DagRunInfo.interval(start, end)
    assert info.run_after == end
    assert info.data_interval == DataInterval(start, end)
    assert info.logical_date == start
    exact = DagRunInfo.exact(datetime(2026, 1, 1, 1, tzinfo=AMS))
    assert exact.run_after == exact.logical_date == datetime(2026, 1, 1, 0, tzinfo=UTC)
    assert exact.run_after.tzinfo is UTC


def test_naive_datetimes_are_refused() -> None:
    with pytest.raises(NaiveDatetime, match=r"has no timezone"):
        DagRunInfo.exact(datetime(2026, 1, 1))
    tt = CronTriggerTimetable("@daily", timezone="UTC")
    with pytest.raises(NaiveDatetime, match=r"restriction\.earliest"):
        tt.next_dagrun_info(last_automated_data_interval=None,
                            restriction=TimeRestriction(datetime(2026, 1, 1), None, True))


def test_run_ids_are_run_after_in_utc_as_airflow_3_builds_them() -> None:
    tt = CronTriggerTimetable("0 18 * * 5", timezone=AMS, interval=timedelta(days=4, hours=9))
    run_after = datetime(2026, 1, 9, 18, tzinfo=AMS)
    interval = tt.infer_manual_data_interval(run_after=run_after)
    assert tt.generate_run_id(run_type="scheduled", run_after=run_after,
                              data_interval=interval) == "scheduled__2026-01-09T17:00:00+00:00"
    assert tt.generate_run_id(run_type="manual", run_after=run_after,
                              data_interval=None) == "manual__2026-01-09T17:00:00+00:00"
    with pytest.raises(ValueError, match="run type must be one of"):
        tt.generate_run_id(run_type="nightly", run_after=run_after, data_interval=None)


def test_clock_is_injected_and_restored() -> None:
    with use_clock(datetime(2026, 3, 1, tzinfo=AMS)):
        assert utcnow() == datetime(2026, 2, 28, 23, tzinfo=UTC)
    assert abs(utcnow() - datetime.now(UTC)) < timedelta(minutes=1)
    with pytest.raises(NaiveDatetime):
        use_clock(datetime(2026, 1, 1)).__enter__()


def test_timetable_for_follows_airflow_3() -> None:
    assert timetable_for("@daily", timezone="Europe/Amsterdam") == CronTriggerTimetable(
        "0 0 * * *", timezone=AMS)
    assert timetable_for("@daily", timezone=AMS, create_cron_data_intervals=True) == (
        CronDataIntervalTimetable("0 0 * * *", AMS))
    assert timetable_for(timedelta(hours=1)) == DeltaTriggerTimetable(timedelta(hours=1))
    assert timetable_for(timedelta(hours=1), create_delta_data_intervals=True) == (
        DeltaDataIntervalTimetable(timedelta(hours=1)))
    assert timetable_for("@once") == OnceTimetable()
    tt = CronTriggerTimetable("5 4 * * *", timezone="UTC")
    assert timetable_for(tt) is tt
    with pytest.raises(InvalidTimetable, match="got int"):
        timetable_for(5)  # type: ignore[arg-type]


@pytest.mark.parametrize(("build", "message"), [
    (lambda: CronTriggerTimetable("61 * * * *", timezone="UTC"),
     "bad cron expression '61 * * * *': bad minute"),
    (lambda: CronTriggerTimetable("0 0 * *", timezone="UTC"), "it has 4 fields"),
    (lambda: CronTriggerTimetable("0 0 * * *", timezone="Mars/Olympus"),
     "unknown timezone 'Mars/Olympus'"),
    (lambda: DeltaTriggerTimetable(timedelta(0)), "does not move"),
    (lambda: DeltaTriggerTimetable(relativedelta(weekday=FR, hour=18)), "does not move"),
    (lambda: CronTriggerTimetable("* * */20 * 1L", timezone="UTC"),
     "matches no moment in the next 50 years"),
    (lambda: CronTriggerTimetable("0 0 * * *", timezone="UTC", interval=timedelta(hours=-1)),
     "interval datetime.timedelta(days=-1, seconds=82800) is negative"),
    (lambda: DeltaTriggerTimetable(timedelta(hours=1), interval=relativedelta(days=-1)),
     "is negative"),
])
def test_bad_arguments_are_one_line_errors(build: object, message: str) -> None:
    with pytest.raises(InvalidTimetable) as info:
        build()  # type: ignore[operator]
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_registry_refuses_unregistered_class_paths_without_importing(tmp_path: Path) -> None:
    marker = tmp_path / "imported"
    (tmp_path / "evil_timetable_for_test.py").write_text(
        f"open({str(marker)!r}, 'w').close()\nclass Evil: pass\n")
    sys.path.insert(0, str(tmp_path))
    try:
        registry = TimetableRegistry()
        registry.load_entry_points()
        with pytest.raises(UnregisteredTimetableClass, match="never imported"):
            deserialize_timetable({"classpath": "evil_timetable_for_test.Evil", "data": {}},
                                  registry)
        assert not marker.exists()
        assert "evil_timetable_for_test" not in sys.modules
    finally:
        sys.path.remove(str(tmp_path))
    tt = CronTriggerTimetable("@daily", timezone="UTC")
    assert deserialize_timetable(serialize_timetable(tt), registry) == tt


def test_stored_data_a_class_cannot_use_is_one_clear_error() -> None:
    registry = TimetableRegistry()
    registry.load_entry_points()
    classpath = "sharedstream.timetables.trigger.CronTriggerTimetable"
    with pytest.raises(InvalidTimetable, match=r"cannot be rebuilt from \{'timezone'"):
        deserialize_timetable({"classpath": classpath, "data": {"timezone": "UTC"}}, registry)
    bad_cron = {"expression": "99 * * * *", "timezone": "UTC",
                "interval": {"days": 0, "seconds": 0, "microseconds": 0},
                "run_immediately": False}
    with pytest.raises(InvalidTimetable, match="bad minute"):
        deserialize_timetable({"classpath": classpath, "data": bad_cron}, registry)
