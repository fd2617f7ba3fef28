"""CronDataIntervalTimetable and DeltaDataIntervalTimetable: next runs, checked by hand.

A data-interval run covers the period that has just ended: it is queued at
the period's end, and its logical date is the period's start.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from dateutil.relativedelta import relativedelta

from sharedstream.timetables.base import DataInterval
from sharedstream.timetables.interval import CronDataIntervalTimetable, DeltaDataIntervalTimetable
from tests.timetables.tables import runs

AMS = ZoneInfo("Europe/Amsterdam")
LONG_AFTER = datetime(2030, 1, 1, tzinfo=UTC)
DAILY = CronDataIntervalTimetable("@daily", "UTC")


def at(*args: int, tz: ZoneInfo | None = None) -> datetime:
    return datetime(*args, tzinfo=tz or UTC)  # type: ignore[arg-type, misc]


def test_enabled_without_catchup_the_last_complete_day_runs_at_once() -> None:
    # Enabled on 31 January at 15:00: the day that ended at midnight runs now.
    assert runs(DAILY, 2, now=at(2026, 1, 31, 15)) == [
        ("2026-01-31T00:00+00:00", "2026-01-30T00:00+00:00", "2026-01-31T00:00+00:00"),
        ("2026-02-01T00:00+00:00", "2026-01-31T00:00+00:00", "2026-02-01T00:00+00:00"),
    ]
    # Exactly at midnight, the day that has just ended.
    assert runs(DAILY, 1, now=at(2026, 1, 31))[0][1:] == (
        "2026-01-30T00:00+00:00", "2026-01-31T00:00+00:00")


def test_a_paused_dag_skips_all_but_the_last_complete_period() -> None:
    # Paused after the run for 30 January, resumed on 2 February at 15:00: 31 January is
    # skipped, 1 February runs at once (Airflow's example).
    last = DataInterval(at(2026, 1, 30), at(2026, 1, 31))
    assert runs(DAILY, 1, now=at(2026, 2, 2, 15), last=last) == [
        ("2026-02-02T00:00+00:00", "2026-02-01T00:00+00:00", "2026-02-02T00:00+00:00")]
    # With catch-up: the next day after the last run.
    assert runs(DAILY, 1, now=at(2026, 2, 2, 15), last=last, catchup=True) == [
        ("2026-02-01T00:00+00:00", "2026-01-31T00:00+00:00", "2026-02-01T00:00+00:00")]


def test_catchup_from_the_start_date_and_the_end_date() -> None:
    assert runs(DAILY, 9, now=LONG_AFTER, earliest=at(2026, 1, 29, 6),
                latest=at(2026, 2, 1), catchup=True) == [
        ("2026-01-31T00:00+00:00", "2026-01-30T00:00+00:00", "2026-01-31T00:00+00:00"),
        ("2026-02-01T00:00+00:00", "2026-01-31T00:00+00:00", "2026-02-01T00:00+00:00"),
        ("2026-02-02T00:00+00:00", "2026-02-01T00:00+00:00", "2026-02-02T00:00+00:00"),
    ]
    # Catch-up with neither a start date nor a previous run: nowhere to start from.
    assert runs(DAILY, 1, now=LONG_AFTER, catchup=True) == []
    # Without catch-up, a start date in the future wins over the clock.
    assert runs(DAILY, 1, now=at(2026, 1, 31, 15), earliest=at(2026, 3, 1)) == [
        ("2026-03-02T00:00+00:00", "2026-03-01T00:00+00:00", "2026-03-02T00:00+00:00")]


def test_month_end_periods() -> None:
    monthly_end = CronDataIntervalTimetable("0 0 L * *", "UTC")
    assert runs(monthly_end, 3, now=LONG_AFTER, earliest=at(2028, 1, 15), catchup=True) == [
        ("2028-02-29T00:00+00:00", "2028-01-31T00:00+00:00", "2028-02-29T00:00+00:00"),
        ("2028-03-31T00:00+00:00", "2028-02-29T00:00+00:00", "2028-03-31T00:00+00:00"),
        ("2028-04-30T00:00+00:00", "2028-03-31T00:00+00:00", "2028-04-30T00:00+00:00"),
    ]
    the_31st = CronDataIntervalTimetable("0 0 31 * *", "UTC")
    assert runs(the_31st, 2, now=LONG_AFTER, earliest=at(2026, 1, 31), catchup=True) == [
        ("2026-03-31T00:00+00:00", "2026-01-31T00:00+00:00", "2026-03-31T00:00+00:00"),
        ("2026-05-31T00:00+00:00", "2026-03-31T00:00+00:00", "2026-05-31T00:00+00:00"),
    ]


def test_dst_periods_are_shorter_and_longer_days() -> None:
    nightly = CronDataIntervalTimetable("30 2 * * *", "Europe/Amsterdam")
    spring = runs(nightly, 3, now=LONG_AFTER, earliest=at(2026, 3, 27, tz=AMS), catchup=True,
                  tz=AMS)
    assert spring == [
        ("2026-03-28T02:30+01:00", "2026-03-27T02:30+01:00", "2026-03-28T02:30+01:00"),
        ("2026-03-29T03:00+02:00", "2026-03-28T02:30+01:00", "2026-03-29T03:00+02:00"),
        ("2026-03-30T02:30+02:00", "2026-03-29T03:00+02:00", "2026-03-30T02:30+02:00"),
    ]
    autumn = runs(nightly, 2, now=LONG_AFTER, earliest=at(2026, 10, 24, tz=AMS), catchup=True,
                  tz=AMS)
    assert autumn == [
        ("2026-10-25T02:30+02:00", "2026-10-24T02:30+02:00", "2026-10-25T02:30+02:00"),
        ("2026-10-26T02:30+01:00", "2026-10-25T02:30+02:00", "2026-10-26T02:30+01:00"),
    ]
    lengths = [datetime.fromisoformat(end) - datetime.fromisoformat(start)
               for _, start, end in spring + autumn]
    assert lengths == [timedelta(hours=24), timedelta(hours=23, minutes=30),
                       timedelta(hours=23, minutes=30), timedelta(hours=24), timedelta(hours=25)]


def test_cron_manual_run_covers_the_last_complete_period() -> None:
    assert DAILY.infer_manual_data_interval(run_after=at(2026, 1, 25, 1)) == DataInterval(
        at(2026, 1, 24), at(2026, 1, 25))
    assert DAILY.infer_manual_data_interval(run_after=at(2026, 1, 25)) == DataInterval(
        at(2026, 1, 24), at(2026, 1, 25))


# -- DeltaDataIntervalTimetable ------------------------------------------------------------------


HALF_HOUR = DeltaDataIntervalTimetable(timedelta(minutes=30))


def test_delta_periods_without_catchup_align_to_the_clock() -> None:
    # Enabled on 1 February at 01:05: the half hour that ended at 01:00 runs at once.
    assert runs(HALF_HOUR, 2, now=at(2026, 2, 1, 1, 5)) == [
        ("2026-02-01T01:00+00:00", "2026-02-01T00:30+00:00", "2026-02-01T01:00+00:00"),
        ("2026-02-01T01:30+00:00", "2026-02-01T01:00+00:00", "2026-02-01T01:30+00:00"),
    ]


def test_delta_periods_with_catchup_follow_the_start_date() -> None:
    assert runs(HALF_HOUR, 3, now=at(2026, 2, 1, 1, 5), earliest=at(2026, 2, 1, 0, 10),
                catchup=True) == [
        ("2026-02-01T00:40+00:00", "2026-02-01T00:10+00:00", "2026-02-01T00:40+00:00"),
        ("2026-02-01T01:10+00:00", "2026-02-01T00:40+00:00", "2026-02-01T01:10+00:00"),
        ("2026-02-01T01:40+00:00", "2026-02-01T01:10+00:00", "2026-02-01T01:40+00:00"),
    ]
    assert runs(HALF_HOUR, 1, now=at(2026, 2, 1, 1, 5), catchup=True) == []


def test_delta_monthly_periods_and_manual_runs() -> None:
    monthly = DeltaDataIntervalTimetable(relativedelta(months=1))
    assert runs(monthly, 2, now=LONG_AFTER, earliest=at(2026, 1, 1), latest=at(2026, 2, 1),
                catchup=True) == [
        ("2026-02-01T00:00+00:00", "2026-01-01T00:00+00:00", "2026-02-01T00:00+00:00"),
        ("2026-03-01T00:00+00:00", "2026-02-01T00:00+00:00", "2026-03-01T00:00+00:00"),
    ]
    assert HALF_HOUR.infer_manual_data_interval(run_after=at(2026, 2, 1, 1, 5)) == DataInterval(
        at(2026, 2, 1, 0, 35), at(2026, 2, 1, 1, 5))


@pytest.mark.parametrize("timetable", [DAILY, HALF_HOUR])
def test_run_after_is_the_end_of_the_data_interval(
        timetable: CronDataIntervalTimetable | DeltaDataIntervalTimetable) -> None:
    for run_after, _start, end in runs(timetable, 5, now=at(2026, 6, 1, 12, 34)):
        assert run_after == end
