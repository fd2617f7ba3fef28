"""Mirror of ``airflow.timetables.trigger``: the trigger timetables."""

from sharedstream.timetables.trigger import (
    CronTriggerTimetable,
    DeltaTriggerTimetable,
    MultipleCronTriggerTimetable,
)

__all__ = ["CronTriggerTimetable", "DeltaTriggerTimetable", "MultipleCronTriggerTimetable"]
