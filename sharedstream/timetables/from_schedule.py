"""The timetable a ``Dag(schedule=...)`` value stands for, as Airflow 3 decides it.

It sits above the built-in timetables it chooses among
(:mod:`~sharedstream.timetables.simple`, :mod:`~sharedstream.timetables.trigger`,
:mod:`~sharedstream.timetables.interval`), which sit above the contract
(:mod:`~sharedstream.timetables.base`): the contract knows none of its
implementations.
"""

from __future__ import annotations

import datetime as dt

from dateutil.relativedelta import relativedelta

from sharedstream.timetables.base import Timetable
from sharedstream.timetables.interval import CronDataIntervalTimetable, DeltaDataIntervalTimetable
from sharedstream.timetables.simple import OnceTimetable
from sharedstream.timetables.trigger import CronTriggerTimetable, DeltaTriggerTimetable
from sharedstream.timetables.values import Delta, InvalidTimetable, parse_timezone

__all__ = ["timetable_for"]


def timetable_for(
    schedule: str | Delta | Timetable,
    *,
    timezone: str | dt.tzinfo = "UTC",
    create_cron_data_intervals: bool = False,
    create_delta_data_intervals: bool = False,
) -> Timetable:
    """The timetable a ``Dag(schedule=...)`` stands for, as Airflow 3 decides it.

    A timetable is itself; a cron expression or preset (``"@daily"``) is a
    :class:`~sharedstream.timetables.trigger.CronTriggerTimetable` in
    ``timezone``; ``"@once"`` a
    :class:`~sharedstream.timetables.simple.OnceTimetable`; a ``timedelta``
    or ``relativedelta`` a
    :class:`~sharedstream.timetables.trigger.DeltaTriggerTimetable`. The two
    flags (Airflow's ``[scheduler] create_cron_data_intervals`` and
    ``create_delta_data_intervals``, both off by default since 3.0) choose
    the data-interval timetables instead.
    """
    if isinstance(schedule, Timetable):
        return schedule
    if isinstance(schedule, str):
        if schedule == "@once":
            return OnceTimetable()
        tz = parse_timezone(timezone)
        if create_cron_data_intervals:
            return CronDataIntervalTimetable(schedule, timezone=tz)
        return CronTriggerTimetable(schedule, timezone=tz)
    if isinstance(schedule, dt.timedelta | relativedelta):
        if create_delta_data_intervals:
            return DeltaDataIntervalTimetable(schedule)
        return DeltaTriggerTimetable(schedule)
    raise InvalidTimetable(
        "a time schedule must be a cron expression, a preset such as '@daily', a timedelta, "
        f"a relativedelta or a Timetable, got {type(schedule).__qualname__}"
    )
