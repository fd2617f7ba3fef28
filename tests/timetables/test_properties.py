"""Invariants of every built-in timetable, over generated schedules, clocks and restrictions.

For any timetable fed its own answers back: ``run_after`` strictly
increases, each data interval is well-formed (``start <= end <= run_after``),
every value is aware and in UTC, no run falls before ``earliest`` or after
``latest``, and run ids never repeat (a restart cannot queue one twice).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from sharedstream.timetables.base import TimeRestriction, Timetable, use_clock
from sharedstream.timetables.events import EventsTimetable
from sharedstream.timetables.interval import CronDataIntervalTimetable, DeltaDataIntervalTimetable
from sharedstream.timetables.trigger import (
    CronTriggerTimetable,
    DeltaTriggerTimetable,
    MultipleCronTriggerTimetable,
)

CRONS = ["@hourly", "30 2 * * *", "0 0 L * *", "*/20 9-17 * * 1-5", "0 0 29 2 *", "15 1,3 * * 0"]
ZONES = ["UTC", "Europe/Amsterdam", "America/New_York", "Australia/Lord_Howe", "Asia/Kolkata"]
moments = st.datetimes(min_value=datetime(2020, 1, 1), max_value=datetime(2035, 1, 1),
                       timezones=st.just(UTC))
deltas = st.timedeltas(min_value=timedelta(minutes=1), max_value=timedelta(days=40))

timetables: st.SearchStrategy[Timetable] = st.one_of(
    st.builds(lambda c, z, i: CronTriggerTimetable(c, timezone=z, interval=i),
              st.sampled_from(CRONS), st.sampled_from(ZONES), deltas | st.just(timedelta())),
    st.builds(CronDataIntervalTimetable, st.sampled_from(CRONS),
              st.sampled_from(ZONES)),
    st.builds(lambda c1, c2, z: MultipleCronTriggerTimetable(c1, c2, timezone=z),
              st.sampled_from(CRONS), st.sampled_from(CRONS), st.sampled_from(ZONES)),
    st.builds(DeltaTriggerTimetable, deltas),
    st.builds(DeltaDataIntervalTimetable, deltas),
    st.builds(EventsTimetable, st.lists(moments, max_size=12)),
)


@settings(max_examples=150, deadline=None)
@given(timetable=timetables, now=moments, earliest=st.none() | moments,
       latest=st.none() | moments, catchup=st.booleans())
def test_runs_move_forward_and_stay_inside_the_restriction(
        timetable: Timetable, now: datetime, earliest: datetime | None,
        latest: datetime | None, catchup: bool) -> None:
    restriction = TimeRestriction(earliest, latest, catchup)
    last = None
    previous = None
    run_ids: set[str] = set()
    with use_clock(now):
        for _ in range(6):
            info = timetable.next_dagrun_info(last_automated_data_interval=last,
                                              restriction=restriction)
            if info is None:
                break
            start, end = info.data_interval
            assert start <= end <= info.run_after
            assert all(value.tzinfo is UTC for value in (info.run_after, start, end))
            if previous is not None:
                assert info.run_after > previous
            if latest is not None:
                assert info.logical_date <= latest or info.run_after <= latest
            if earliest is not None:
                assert info.run_after >= earliest
            run_id = timetable.generate_run_id(run_type="scheduled", run_after=info.run_after,
                                               data_interval=info.data_interval)
            assert run_id not in run_ids
            run_ids.add(run_id)
            previous, last = info.run_after, info.data_interval
