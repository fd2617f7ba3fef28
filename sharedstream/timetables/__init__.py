"""Time-based schedules: Airflow's timetables (see ``docs/schedules.md``).

:mod:`~sharedstream.timetables.base` holds the contract every timetable
implements, run ids and the registry stored timetables are rebuilt from;
the other modules hold the built-in timetables, under Airflow's names, and
:mod:`~sharedstream.timetables.from_schedule` the one that a ``schedule=``
value stands for; all re-exported here.
"""

from sharedstream.timetables.assets import AssetOrTimeSchedule
from sharedstream.timetables.base import (
    DagRunInfo,
    DataInterval,
    InvalidTimetable,
    NaiveDatetime,
    TimeRestriction,
    Timetable,
    TimetableRegistry,
    UnregisteredTimetableClass,
    use_clock,
)
from sharedstream.timetables.events import EventsTimetable
from sharedstream.timetables.from_schedule import timetable_for
from sharedstream.timetables.interval import CronDataIntervalTimetable, DeltaDataIntervalTimetable
from sharedstream.timetables.simple import OnceTimetable
from sharedstream.timetables.trigger import (
    CronTriggerTimetable,
    DeltaTriggerTimetable,
    MultipleCronTriggerTimetable,
)

__all__ = [
    "AssetOrTimeSchedule",
    "CronDataIntervalTimetable",
    "CronTriggerTimetable",
    "DagRunInfo",
    "DataInterval",
    "DeltaDataIntervalTimetable",
    "DeltaTriggerTimetable",
    "EventsTimetable",
    "InvalidTimetable",
    "MultipleCronTriggerTimetable",
    "NaiveDatetime",
    "OnceTimetable",
    "TimeRestriction",
    "Timetable",
    "TimetableRegistry",
    "UnregisteredTimetableClass",
    "timetable_for",
    "use_clock",
]
