"""Airflow's timetable imports port by the one rule ``airflow.X`` -> ``sharedstream.airflow.X``."""

from __future__ import annotations

import importlib

import pytest

MIRRORED = {
    "base": ["DagRunInfo", "DataInterval", "TimeRestriction", "Timetable"],
    "trigger": ["CronTriggerTimetable", "DeltaTriggerTimetable", "MultipleCronTriggerTimetable"],
    "interval": ["CronDataIntervalTimetable", "DeltaDataIntervalTimetable"],
    "events": ["EventsTimetable"],
    "assets": ["AssetOrTimeSchedule", "AssetTriggeredTimetable"],
    "simple": ["OnceTimetable"],
}


@pytest.mark.parametrize("module", sorted(MIRRORED))
def test_mirror_re_exports_the_same_objects(module: str) -> None:
    mirror = importlib.import_module(f"sharedstream.airflow.timetables.{module}")
    own = importlib.import_module(f"sharedstream.timetables.{module}")
    assert sorted(mirror.__all__) == sorted(MIRRORED[module])
    for name in MIRRORED[module]:
        assert getattr(mirror, name) is getattr(own, name), name
