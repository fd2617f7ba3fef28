"""Custom timetables: the seed's two examples written by hand, and one installed as a plugin.

The plugin is a real installed distribution: a ``.dist-info`` folder on
``sys.path`` whose ``entry_points.txt`` declares the class under the
``sharedstream.timetables`` group, found by ``importlib.metadata`` exactly as
a ``pip install``-ed package is.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from sharedstream.timetables.base import (
    DataInterval,
    TimetableRegistry,
    UnregisteredTimetableClass,
    deserialize_timetable,
    serialize_timetable,
)
from sharedstream.timetables.trigger import MultipleCronTriggerTimetable
from tests.timetables.custom_timetables import TwiceDailyTimetable, WorkWeekTimetable
from tests.timetables.tables import run_afters, runs

LONG_AFTER = datetime(2030, 1, 1, tzinfo=UTC)
WORK_WEEK_PATH = "tests.timetables.custom_timetables.WorkWeekTimetable"


def at(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)  # type: ignore[arg-type, misc]


def test_work_week_timetable() -> None:
    # 1 January 2026 is a Thursday.
    assert runs(WorkWeekTimetable(), 3, now=LONG_AFTER, earliest=at(2026, 1, 1),
                catchup=True) == [
        ("2026-01-02T18:00+00:00", "2025-12-29T09:00+00:00", "2026-01-02T18:00+00:00"),
        ("2026-01-09T18:00+00:00", "2026-01-05T09:00+00:00", "2026-01-09T18:00+00:00"),
        ("2026-01-16T18:00+00:00", "2026-01-12T09:00+00:00", "2026-01-16T18:00+00:00"),
    ]
    # Without catch-up, enabled on Saturday 10 January: next Friday.
    assert run_afters(runs(WorkWeekTimetable(), 1, now=at(2026, 1, 10),
                           earliest=at(2026, 1, 1))) == ["2026-01-16T18:00+00:00"]
    assert WorkWeekTimetable().infer_manual_data_interval(run_after=at(2026, 1, 14)) == (
        DataInterval(at(2026, 1, 5, 9), at(2026, 1, 9, 18)))


def test_twice_daily_timetable_matches_multiple_cron_run_for_run() -> None:
    custom = runs(TwiceDailyTimetable(), 4, now=LONG_AFTER, earliest=at(2026, 1, 1),
                  catchup=True)
    assert custom == [
        ("2026-01-01T01:10+00:00", "2025-12-31T02:40+00:00", "2026-01-01T01:10+00:00"),
        ("2026-01-01T02:40+00:00", "2026-01-01T01:10+00:00", "2026-01-01T02:40+00:00"),
        ("2026-01-02T01:10+00:00", "2026-01-01T02:40+00:00", "2026-01-02T01:10+00:00"),
        ("2026-01-02T02:40+00:00", "2026-01-02T01:10+00:00", "2026-01-02T02:40+00:00"),
    ]
    multiple = MultipleCronTriggerTimetable("10 1 * * *", "40 2 * * *", timezone="UTC")
    assert run_afters(custom) == run_afters(
        runs(multiple, 4, now=LONG_AFTER, earliest=at(2026, 1, 1), catchup=True))
    assert run_afters(runs(TwiceDailyTimetable(), 2, now=at(2026, 1, 1, 2))) == [
        "2026-01-01T02:40+00:00", "2026-01-02T01:10+00:00"]
    assert TwiceDailyTimetable().infer_manual_data_interval(run_after=at(2026, 1, 1, 2)) == (
        DataInterval(at(2025, 12, 31, 2, 40), at(2026, 1, 1, 1, 10)))


@pytest.fixture
def installed_plugin(tmp_path: Path) -> Iterator[None]:
    """A distribution declaring WorkWeekTimetable under ``sharedstream.timetables``."""
    dist_info = tmp_path / "sharedstream_workweek_plugin-1.0.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: sharedstream-workweek-plugin\nVersion: 1.0\n")
    (dist_info / "entry_points.txt").write_text(
        "[sharedstream.timetables]\n"
        "WorkWeekTimetable = tests.timetables.custom_timetables:WorkWeekTimetable\n")
    sys.path.insert(0, str(tmp_path))
    try:
        yield
    finally:
        sys.path.remove(str(tmp_path))


def test_a_custom_timetable_is_rebuilt_only_once_its_plugin_is_installed(
        tmp_path: Path) -> None:
    stored = serialize_timetable(WorkWeekTimetable())
    assert stored == {"classpath": WORK_WEEK_PATH, "data": {}}
    before = TimetableRegistry()
    before.load_entry_points()
    # Importable, but not registered: refused all the same.
    with pytest.raises(UnregisteredTimetableClass, match="WorkWeekTimetable"):
        deserialize_timetable(stored, before)


def test_a_registered_plugin_timetable_round_trips(installed_plugin: None) -> None:
    registry = TimetableRegistry()
    registry.load_entry_points()
    assert WORK_WEEK_PATH in registry
    rebuilt = deserialize_timetable(serialize_timetable(WorkWeekTimetable()), registry)
    assert isinstance(rebuilt, WorkWeekTimetable)
    assert runs(rebuilt, 2, now=LONG_AFTER, earliest=at(2026, 1, 1), catchup=True) == runs(
        WorkWeekTimetable(), 2, now=LONG_AFTER, earliest=at(2026, 1, 1), catchup=True)
