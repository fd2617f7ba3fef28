"""Mirror of ``airflow.timetables.assets``: ``AssetOrTimeSchedule``, ``AssetTriggeredTimetable``.

``AssetTriggeredTimetable`` is Airflow 3.4's (also exported by
``sharedstream.airflow.sdk``, as by ``airflow.sdk``).
"""

from sharedstream.timetables.assets import AssetOrTimeSchedule, AssetTriggeredTimetable

__all__ = ["AssetOrTimeSchedule", "AssetTriggeredTimetable"]
