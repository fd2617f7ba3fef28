"""Mirror of ``airflow.timetables.interval``: the cron and delta data-interval timetables."""

from sharedstream.timetables.interval import CronDataIntervalTimetable, DeltaDataIntervalTimetable

__all__ = ["CronDataIntervalTimetable", "DeltaDataIntervalTimetable"]
