"""Every timetable survives storage: serialize, JSON, rebuild through the registry, same runs."""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone, tzinfo
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from dateutil.relativedelta import FR, relativedelta

from sharedstream.runtime.definitions import Asset
from sharedstream.timetables.assets import AssetOrTimeSchedule
from sharedstream.timetables.base import (
    ENTRY_POINT_GROUP,
    InvalidTimetable,
    Timetable,
    TimetableRegistry,
    deserialize_timetable,
    serialize_timetable,
)
from sharedstream.timetables.events import EventsTimetable
from sharedstream.timetables.interval import CronDataIntervalTimetable, DeltaDataIntervalTimetable
from sharedstream.timetables.simple import OnceTimetable
from sharedstream.timetables.trigger import (
    CronTriggerTimetable,
    DeltaTriggerTimetable,
    MultipleCronTriggerTimetable,
)
from tests.timetables.tables import runs

AMS = ZoneInfo("Europe/Amsterdam")
NEXT_FRIDAY = relativedelta(days=+1, weekday=FR(+1), hour=18, minute=0, second=0, microsecond=0)

TIMETABLES: list[Timetable] = [
    CronTriggerTimetable("@daily", timezone="UTC"),
    CronTriggerTimetable("0 18 * * 5", timezone=AMS, interval=timedelta(days=4, hours=9),
                         run_immediately=timedelta(minutes=90)),
    CronTriggerTimetable("*/15 9-17 * * 1-5", timezone=timezone(timedelta(hours=-3, minutes=-30)),
                         run_immediately=None),
    CronTriggerTimetable("0 0 L * *", timezone=UTC, run_immediately=True,
                         interval=relativedelta(months=1)),
    DeltaTriggerTimetable(timedelta(hours=6)),
    DeltaTriggerTimetable(NEXT_FRIDAY, interval=timedelta(days=4, hours=9)),
    MultipleCronTriggerTimetable("10 1 * * *", "40 2 * * *", timezone="Europe/Amsterdam",
                                 interval=timedelta(hours=1)),
    CronDataIntervalTimetable("30 2 * * *", "Europe/Amsterdam"),
    DeltaDataIntervalTimetable(timedelta(minutes=30)),
    DeltaDataIntervalTimetable(relativedelta(months=1, days=2)),
    EventsTimetable([datetime(2026, 4, 5, 8, 27, tzinfo=ZoneInfo("America/Chicago")),
                     datetime(2026, 1, 1, tzinfo=UTC)],
                    restrict_to_events=True, description="Games"),
    EventsTimetable([]),
    OnceTimetable(),
    AssetOrTimeSchedule(timetable=CronTriggerTimetable("0 1 * * 3", timezone="UTC"),
                        assets=(Asset("a") & Asset("b")) | Asset("c")),
]


@pytest.fixture(scope="module")
def registry() -> TimetableRegistry:
    registry = TimetableRegistry()
    registry.load_entry_points()
    return registry


@pytest.mark.parametrize("timetable", TIMETABLES, ids=lambda t: f"{type(t).__name__}")
def test_round_trip(timetable: Timetable, registry: TimetableRegistry) -> None:
    stored = json.loads(json.dumps(serialize_timetable(timetable)))
    rebuilt = deserialize_timetable(stored, registry)
    assert type(rebuilt) is type(timetable)
    assert rebuilt == timetable
    assert serialize_timetable(rebuilt) == stored
    assert (rebuilt.summary, rebuilt.description) == (timetable.summary, timetable.description)
    now, earliest = datetime(2026, 3, 1, 12, tzinfo=UTC), datetime(2026, 1, 1, tzinfo=UTC)
    for catchup in (True, False):
        assert runs(rebuilt, 5, now=now, earliest=earliest, catchup=catchup) == runs(
            timetable, 5, now=now, earliest=earliest, catchup=catchup)


def test_every_built_in_is_registered_by_entry_point(registry: TimetableRegistry) -> None:
    for timetable in TIMETABLES:
        cls = type(timetable)
        assert f"{cls.__module__}.{cls.__qualname__}" in registry, cls.__name__


def test_stored_form_is_plain_data() -> None:
    assert serialize_timetable(TIMETABLES[1]) == {
        "classpath": "sharedstream.timetables.trigger.CronTriggerTimetable",
        "data": {"expression": "0 18 * * 5", "timezone": "Europe/Amsterdam",
                 "interval": {"days": 4, "seconds": 32400, "microseconds": 0},
                 "run_immediately": {"seconds": 5400.0}},
    }
    assert serialize_timetable(TIMETABLES[2])["data"]["timezone"] == "-03:30"
    assert serialize_timetable(TIMETABLES[5])["data"]["delta"] == {"relativedelta": {
        "days": 1, "hour": 18, "minute": 0, "second": 0, "microsecond": 0, "weekday": [4, 1]}}


class Unstorable(Timetable):
    def serialize(self) -> dict[str, object]:
        return {"when": datetime(2026, 1, 1, tzinfo=UTC)}


def test_data_that_is_not_json_is_refused_when_stored() -> None:
    with pytest.raises(InvalidTimetable, match=r"Unstorable\.serialize\(\) returned data"):
        serialize_timetable(Unstorable())


def test_unstorable_timezones_are_refused() -> None:
    class Odd(tzinfo):
        def utcoffset(self, dt: datetime | None) -> timedelta:
            return timedelta(0)

        def dst(self, dt: datetime | None) -> timedelta:
            return timedelta(0)

        def tzname(self, dt: datetime | None) -> str:
            return "odd"

    with pytest.raises(InvalidTimetable, match="cannot be stored"):
        CronTriggerTimetable("@daily", timezone=Odd())


@pytest.fixture
def broken_plugin(tmp_path: Path) -> Iterator[None]:
    dist_info = tmp_path / "broken_timetables-1.0.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-timetables\n"
                                        "Version: 1.0\n")
    (dist_info / "entry_points.txt").write_text(
        f"[{ENTRY_POINT_GROUP}]\nGone = no_such_module_for_timetables:Gone\n")
    sys.path.insert(0, str(tmp_path))
    try:
        yield
    finally:
        sys.path.remove(str(tmp_path))


def test_a_broken_plugin_is_logged_and_skipped(broken_plugin: None,
                                               caplog: pytest.LogCaptureFixture) -> None:
    registry = TimetableRegistry()
    with caplog.at_level(logging.ERROR, logger="sharedstream.timetables"):
        registry.load_entry_points()
    assert "no_such_module_for_timetables:Gone" in caplog.text
    assert "sharedstream.timetables.trigger.CronTriggerTimetable" in registry
