"""Mirror of ``airflow.timetables.simple``, as far as time goes: ``OnceTimetable`` (``@once``)."""

from sharedstream.timetables.simple import OnceTimetable

__all__ = ["OnceTimetable"]
