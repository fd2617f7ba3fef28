"""CronTriggerTimetable, DeltaTriggerTimetable and MultipleCronTriggerTimetable: next runs.

Every table below was worked out by hand from a calendar (2026: EU summer
time starts Sunday 29 March and ends Sunday 25 October; US daylight time
starts Sunday 8 March and ends Sunday 1 November; 2028 is a leap year).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from dateutil.relativedelta import FR, relativedelta

from sharedstream.timetables.base import DataInterval, TimeRestriction, use_clock
from sharedstream.timetables.interval import DeltaDataIntervalTimetable
from sharedstream.timetables.trigger import (
    CronTriggerTimetable,
    DeltaTriggerTimetable,
    MultipleCronTriggerTimetable,
)
from tests.timetables.tables import run_afters, runs

AMS = ZoneInfo("Europe/Amsterdam")
NYC = ZoneInfo("America/New_York")
LONG_AFTER = datetime(2030, 1, 1, tzinfo=UTC)
"""A clock far past every table, for catch-up tables the clock does not affect."""


def at(*args: int, tz: ZoneInfo | None = None) -> datetime:
    return datetime(*args, tzinfo=tz or UTC)  # type: ignore[arg-type, misc]


# -- CronTriggerTimetable: where the first run falls ----------------------------------------------

DAILY = CronTriggerTimetable("@daily", timezone="UTC")
JAN31_3PM = at(2026, 1, 31, 15)


def first(timetable: CronTriggerTimetable | DeltaTriggerTimetable, *, now: datetime,
          **kwargs: object) -> str:
    [(run_after, _start, _end)] = runs(timetable, 1, now=now, **kwargs)  # type: ignore[arg-type]
    return run_after


def test_without_catchup_the_first_run_is_the_next_point() -> None:
    # Airflow's example: a @daily DAG enabled on 31 January at 15:00 first runs at midnight.
    assert first(DAILY, now=JAN31_3PM) == "2026-02-01T00:00+00:00"
    assert first(DAILY, now=JAN31_3PM, earliest=at(2025, 6, 1)) == "2026-02-01T00:00+00:00"
    # Exactly on a point: that point is due now.
    assert first(DAILY, now=at(2026, 2, 1)) == "2026-02-01T00:00+00:00"
    # A start date in the future is aligned up to the schedule.
    assert first(DAILY, now=JAN31_3PM, earliest=at(2026, 3, 1, 10)) == "2026-03-02T00:00+00:00"


def test_without_catchup_a_paused_dag_skips_what_it_missed() -> None:
    # Paused after the 31 January run, resumed on 2 February at 15:00: 1 and 2 February are
    # skipped, the next run is 3 February (Airflow's example).
    last = DataInterval.exact(at(2026, 1, 31))
    assert first(DAILY, now=at(2026, 2, 2, 15), last=last) == "2026-02-03T00:00+00:00"
    # Running normally, the next run is the next point even if asked a little late.
    assert first(DAILY, now=at(2026, 1, 31, 0, 0, 3), last=last) == "2026-02-01T00:00+00:00"


@pytest.mark.parametrize(("run_immediately", "now", "expected"), [
    (True, JAN31_3PM, "2026-01-31T00:00+00:00"),
    (timedelta(hours=16), JAN31_3PM, "2026-01-31T00:00+00:00"),
    (timedelta(hours=14), JAN31_3PM, "2026-02-01T00:00+00:00"),
    (None, JAN31_3PM, "2026-02-01T00:00+00:00"),  # 15 h ago > a tenth of a day
    (None, at(2026, 1, 31, 2), "2026-01-31T00:00+00:00"),  # 2 h ago <= 2.4 h
    (False, at(2026, 1, 31, 0, 1), "2026-02-01T00:00+00:00"),
])
def test_run_immediately(run_immediately: bool | timedelta | None, now: datetime,
                         expected: str) -> None:
    timetable = CronTriggerTimetable("@daily", timezone="UTC", run_immediately=run_immediately)
    assert first(timetable, now=now) == expected


def test_catchup_runs_every_missed_point_in_order_from_the_start_date() -> None:
    assert runs(DAILY, 4, now=JAN31_3PM, earliest=at(2026, 1, 29, 12), catchup=True) == [
        ("2026-01-30T00:00+00:00", "2026-01-30T00:00+00:00", "2026-01-30T00:00+00:00"),
        ("2026-01-31T00:00+00:00", "2026-01-31T00:00+00:00", "2026-01-31T00:00+00:00"),
        ("2026-02-01T00:00+00:00", "2026-02-01T00:00+00:00", "2026-02-01T00:00+00:00"),
        ("2026-02-02T00:00+00:00", "2026-02-02T00:00+00:00", "2026-02-02T00:00+00:00"),
    ]
    # Resumed after a pause with catch-up: continues right after the last run.
    last = DataInterval.exact(at(2026, 1, 31))
    assert first(DAILY, now=at(2026, 2, 2, 15), last=last, catchup=True) == (
        "2026-02-01T00:00+00:00")


def test_the_end_date_stops_the_schedule_and_is_inclusive() -> None:
    assert run_afters(runs(DAILY, 9, now=LONG_AFTER, earliest=at(2026, 1, 29),
                           latest=at(2026, 1, 31), catchup=True)) == [
        "2026-01-29T00:00+00:00", "2026-01-30T00:00+00:00", "2026-01-31T00:00+00:00"]
    assert runs(DAILY, 1, now=JAN31_3PM, latest=at(2026, 1, 31, 23)) == []


# -- month ends -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("cron", "start", "expected"), [
    ("0 0 31 * *", at(2026, 1, 1), ["2026-01-31", "2026-03-31", "2026-05-31", "2026-07-31",
                                     "2026-08-31", "2026-10-31", "2026-12-31"]),
    ("0 0 L * *", at(2028, 1, 1), ["2028-01-31", "2028-02-29", "2028-03-31", "2028-04-30",
                                    "2028-05-31", "2028-06-30", "2028-07-31"]),
    ("0 0 29 2 *", at(2025, 1, 1), ["2028-02-29", "2032-02-29", "2036-02-29", "2040-02-29",
                                     "2044-02-29", "2048-02-29", "2052-02-29"]),
    ("0 0 1 * *", at(2026, 11, 15), ["2026-12-01", "2027-01-01", "2027-02-01", "2027-03-01",
                                      "2027-04-01", "2027-05-01", "2027-06-01"]),
])
def test_month_ends(cron: str, start: datetime, expected: list[str]) -> None:
    timetable = CronTriggerTimetable(cron, timezone="UTC")
    got = run_afters(runs(timetable, 7, now=LONG_AFTER, earliest=start, catchup=True))
    assert [day[:10] for day in got] == expected
    assert all(day[10:] == "T00:00+00:00" for day in got)


# -- daylight saving time (cronsim follows Debian's cron) -----------------------------------------


def test_daily_0230_across_the_spring_forward_runs_right_after_the_jump() -> None:
    # 02:30 does not exist on 29 March in Amsterdam: the run is at 03:00 (the first minute after).
    timetable = CronTriggerTimetable("30 2 * * *", timezone="Europe/Amsterdam")
    got = runs(timetable, 4, now=LONG_AFTER, earliest=at(2026, 3, 27, tz=AMS), catchup=True,
               tz=AMS)
    assert run_afters(got) == ["2026-03-27T02:30+01:00", "2026-03-28T02:30+01:00",
                               "2026-03-29T03:00+02:00", "2026-03-30T02:30+02:00"]
    nyc = CronTriggerTimetable("30 2 * * *", timezone=NYC)
    assert run_afters(runs(nyc, 3, now=LONG_AFTER, earliest=at(2026, 3, 7, tz=NYC),
                           catchup=True, tz=NYC)) == [
        "2026-03-07T02:30-05:00", "2026-03-08T03:00-04:00", "2026-03-09T02:30-04:00"]


def test_daily_0230_across_the_fall_back_runs_once() -> None:
    # 02:30 happens twice on 25 October in Amsterdam: one run, at the first (summer) 02:30.
    timetable = CronTriggerTimetable("30 2 * * *", timezone="Europe/Amsterdam")
    got = runs(timetable, 3, now=LONG_AFTER, earliest=at(2026, 10, 24, tz=AMS), catchup=True,
               tz=AMS)
    assert run_afters(got) == ["2026-10-24T02:30+02:00", "2026-10-25T02:30+02:00",
                               "2026-10-26T02:30+01:00"]
    nyc = CronTriggerTimetable("30 1 * * *", timezone=NYC)
    assert run_afters(runs(nyc, 3, now=LONG_AFTER, earliest=at(2026, 10, 31, tz=NYC),
                           catchup=True, tz=NYC)) == [
        "2026-10-31T01:30-04:00", "2026-11-01T01:30-04:00", "2026-11-02T01:30-05:00"]


def test_hourly_jobs_follow_the_clock_through_both_transitions() -> None:
    hourly = CronTriggerTimetable("30 * * * *", timezone=AMS)
    assert run_afters(runs(hourly, 3, now=LONG_AFTER, earliest=at(2026, 3, 29, 1, tz=AMS),
                           catchup=True, tz=AMS)) == [
        "2026-03-29T01:30+01:00", "2026-03-29T03:30+02:00", "2026-03-29T04:30+02:00"]
    # In the repeated hour, 02:30 runs twice: an hour apart, as the clock is.
    got = runs(hourly, 4, now=LONG_AFTER, earliest=at(2026, 10, 25, 1, tz=AMS), catchup=True)
    assert run_afters(got) == ["2026-10-24T23:30+00:00", "2026-10-25T00:30+00:00",
                               "2026-10-25T01:30+00:00", "2026-10-25T02:30+00:00"]


def test_the_seed_work_week_run_covers_monday_0900_to_friday_1800() -> None:
    # "Runs every Friday at 18:00 to cover the work week (9:00 Monday to 18:00 Friday)."
    timetable = CronTriggerTimetable("0 18 * * 5", timezone="Europe/Amsterdam",
                                     interval=timedelta(days=4, hours=9))
    got = runs(timetable, 3, now=LONG_AFTER, earliest=at(2026, 3, 16, tz=AMS), catchup=True,
               tz=AMS)
    assert got == [
        ("2026-03-20T18:00+01:00", "2026-03-16T09:00+01:00", "2026-03-20T18:00+01:00"),
        ("2026-03-27T18:00+01:00", "2026-03-23T09:00+01:00", "2026-03-27T18:00+01:00"),
        ("2026-04-03T18:00+02:00", "2026-03-30T09:00+02:00", "2026-04-03T18:00+02:00"),
    ]
    # The logical date is the start of the data interval, Monday 09:00.
    info = timetable.next_dagrun_info(last_automated_data_interval=None,
                                      restriction=TimeRestriction(at(2026, 3, 16, tz=AMS), None,
                                                                  True))
    assert info is not None
    assert info.logical_date == at(2026, 3, 16, 8)


def test_manual_runs_cover_the_interval_ending_when_triggered() -> None:
    timetable = CronTriggerTimetable("0 18 * * 5", timezone="UTC",
                                     interval=timedelta(days=4, hours=9))
    assert timetable.infer_manual_data_interval(run_after=at(2026, 1, 7, 12)) == DataInterval(
        at(2026, 1, 3, 3), at(2026, 1, 7, 12))


# -- DeltaTriggerTimetable ------------------------------------------------------------------------


def test_delta_trigger_runs_at_once_then_every_delta() -> None:
    every6h = DeltaTriggerTimetable(timedelta(hours=6))
    # No start date: the points are whole deltas since the Unix epoch (as Airflow rounds).
    assert run_afters(runs(every6h, 3, now=JAN31_3PM)) == [
        "2026-01-31T12:00+00:00", "2026-01-31T18:00+00:00", "2026-02-01T00:00+00:00"]
    assert run_afters(runs(every6h, 2, now=JAN31_3PM, earliest=at(2026, 2, 1))) == [
        "2026-02-01T00:00+00:00", "2026-02-01T06:00+00:00"]
    assert run_afters(runs(every6h, 9, now=LONG_AFTER, earliest=at(2026, 1, 31),
                           latest=at(2026, 1, 31, 18), catchup=True)) == [
        "2026-01-31T00:00+00:00", "2026-01-31T06:00+00:00", "2026-01-31T12:00+00:00",
        "2026-01-31T18:00+00:00"]


def _first_two(timetable: DeltaTriggerTimetable | DeltaDataIntervalTimetable, now: datetime,
               start: datetime | None) -> list[tuple[str, datetime]]:
    """The first two runs without catch-up at ``now``: (run id, logical date)."""
    restriction = TimeRestriction(start, None, False)
    found, last = [], None
    with use_clock(now):
        for _ in range(2):
            info = timetable.next_dagrun_info(last_automated_data_interval=last,
                                              restriction=restriction)
            assert info is not None
            found.append((timetable.generate_run_id(run_type="scheduled", run_after=info.run_after,
                                                    data_interval=info.data_interval),
                          info.logical_date))
            last = info.data_interval
    return found


@pytest.mark.parametrize("timetable", [DeltaTriggerTimetable(timedelta(minutes=7)),
                                       DeltaDataIntervalTimetable(timedelta(minutes=7))])
def test_a_timedelta_schedule_runs_at_the_start_date_plus_whole_deltas(
        timetable: DeltaTriggerTimetable | DeltaDataIntervalTimetable) -> None:
    # Issue 31, item 12: enabled at 15:04:05.123456, a 7-minute schedule that started at 00:03
    # runs at 00:03 + k * 7 min (14:59, 15:06), never at "now" with its seconds and microseconds.
    start = at(2026, 1, 31, 0, 3)
    now = datetime(2026, 1, 31, 15, 4, 5, 123456, tzinfo=UTC)
    found = _first_two(timetable, now, start)
    step = timedelta(minutes=7)
    for run_id, logical_date in found:
        assert (logical_date - start) % step == timedelta(0), (run_id, logical_date)
        assert logical_date.second == logical_date.microsecond == 0
        assert "." not in run_id  # no microseconds
    if isinstance(timetable, DeltaTriggerTimetable):
        assert [run_id for run_id, _ in found] == [
            "scheduled__2026-01-31T14:59:00+00:00", "scheduled__2026-01-31T15:06:00+00:00"]
    else:  # the period that ended at 14:59 runs at once; its logical date is its start
        assert found == [("scheduled__2026-01-31T14:59:00+00:00", at(2026, 1, 31, 14, 52)),
                         ("scheduled__2026-01-31T15:06:00+00:00", at(2026, 1, 31, 14, 59))]


def test_a_timedelta_schedule_without_a_start_date_counts_from_the_epoch() -> None:
    now = datetime(2026, 1, 31, 15, 4, 5, 123456, tzinfo=UTC)
    ((run_id, logical_date), _) = _first_two(DeltaTriggerTimetable(timedelta(minutes=7)), now,
                                             None)
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    assert (logical_date - epoch) % timedelta(minutes=7) == timedelta(0)
    assert timedelta(0) <= now - logical_date < timedelta(minutes=7)
    assert "." not in run_id


def test_delta_trigger_relativedelta_months_keep_the_day_when_they_can() -> None:
    monthly = DeltaTriggerTimetable(relativedelta(months=1))
    assert [r[:10] for r in run_afters(runs(monthly, 4, now=LONG_AFTER, earliest=at(2026, 1, 31),
                                            catchup=True))] == [
        "2026-01-31", "2026-02-28", "2026-03-28", "2026-04-28"]


def test_delta_trigger_seed_work_week_with_a_relativedelta() -> None:
    # The seed's relativedelta(weekday=FR(), hour=18) leaves a Friday 18:00 where it is (refused,
    # see test_base); "the next Friday 18:00 after" is spelled with days=+1.
    next_friday_1800 = relativedelta(days=+1, weekday=FR, hour=18, minute=0, second=0,
                                     microsecond=0)
    timetable = DeltaTriggerTimetable(next_friday_1800, interval=timedelta(days=4, hours=9))
    assert runs(timetable, 2, now=LONG_AFTER, earliest=at(2025, 1, 3, 18), catchup=True) == [
        ("2025-01-03T18:00+00:00", "2024-12-30T09:00+00:00", "2025-01-03T18:00+00:00"),
        ("2025-01-10T18:00+00:00", "2025-01-06T09:00+00:00", "2025-01-10T18:00+00:00"),
    ]


# -- MultipleCronTriggerTimetable -----------------------------------------------------------------


def test_the_seed_runs_at_0110_and_0240_each_day() -> None:
    timetable = MultipleCronTriggerTimetable("10 1 * * *", "40 2 * * *", timezone="UTC")
    assert run_afters(runs(timetable, 5, now=LONG_AFTER, earliest=at(2026, 1, 1),
                           catchup=True)) == [
        "2026-01-01T01:10+00:00", "2026-01-01T02:40+00:00", "2026-01-02T01:10+00:00",
        "2026-01-02T02:40+00:00", "2026-01-03T01:10+00:00"]
    # Without catch-up, from 02:00 the next is 02:40, then tomorrow 01:10.
    assert run_afters(runs(timetable, 2, now=at(2026, 1, 1, 2))) == [
        "2026-01-01T02:40+00:00", "2026-01-02T01:10+00:00"]


def test_multiple_cron_interval_and_shared_points() -> None:
    timetable = MultipleCronTriggerTimetable("10 1 * * *", "40 2 * * *", timezone="UTC",
                                             interval=timedelta(hours=1))
    assert runs(timetable, 2, now=LONG_AFTER, earliest=at(2026, 1, 1), catchup=True) == [
        ("2026-01-01T01:10+00:00", "2026-01-01T00:10+00:00", "2026-01-01T01:10+00:00"),
        ("2026-01-01T02:40+00:00", "2026-01-01T01:40+00:00", "2026-01-01T02:40+00:00"),
    ]
    # Midnight on the 1st matches both expressions: one run.
    overlapping = MultipleCronTriggerTimetable("0 0 * * *", "0 0 1 * *", timezone="UTC")
    assert run_afters(runs(overlapping, 3, now=LONG_AFTER, earliest=at(2026, 1, 31),
                           catchup=True)) == [
        "2026-01-31T00:00+00:00", "2026-02-01T00:00+00:00", "2026-02-02T00:00+00:00"]
    assert overlapping.summary == "0 0 * * *, 0 0 1 * *"


def test_multiple_cron_across_both_dst_changes() -> None:
    timetable = MultipleCronTriggerTimetable("10 1 * * *", "40 2 * * *", timezone=AMS)
    spring = runs(timetable, 4, now=LONG_AFTER, earliest=at(2026, 3, 28, 2, tz=AMS),
                  catchup=True, tz=AMS)
    assert run_afters(spring) == ["2026-03-28T02:40+01:00", "2026-03-29T01:10+01:00",
                                  "2026-03-29T03:00+02:00", "2026-03-30T01:10+02:00"]
    autumn = runs(timetable, 4, now=LONG_AFTER, earliest=at(2026, 10, 25, tz=AMS),
                  catchup=True, tz=AMS)
    assert run_afters(autumn) == ["2026-10-25T01:10+02:00", "2026-10-25T02:40+02:00",
                                  "2026-10-26T01:10+01:00", "2026-10-26T02:40+01:00"]
