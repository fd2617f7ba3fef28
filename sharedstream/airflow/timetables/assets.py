"""Mirror of ``airflow.timetables.assets``: ``AssetOrTimeSchedule``."""

from sharedstream.timetables.assets import AssetOrTimeSchedule

__all__ = ["AssetOrTimeSchedule"]
