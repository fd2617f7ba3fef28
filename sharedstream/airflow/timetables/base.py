"""Mirror of ``airflow.timetables.base``: the timetable contract.

``from airflow.timetables.base import DagRunInfo, DataInterval, Timetable``
ports as ``from sharedstream.airflow.timetables.base import ...``. The
objects are :mod:`sharedstream.timetables.base`'s own.
"""

from sharedstream.timetables.base import DagRunInfo, DataInterval, TimeRestriction, Timetable

__all__ = ["DagRunInfo", "DataInterval", "TimeRestriction", "Timetable"]
