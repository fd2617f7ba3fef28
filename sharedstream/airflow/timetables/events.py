"""Mirror of ``airflow.timetables.events``: ``EventsTimetable``."""

from sharedstream.timetables.events import EventsTimetable

__all__ = ["EventsTimetable"]
