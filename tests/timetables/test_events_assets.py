"""EventsTimetable (a run at each listed moment) and AssetOrTimeSchedule (assets or time)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from sharedstream.runtime.definitions import Asset, AssetAll, AssetAny
from sharedstream.timetables.assets import AssetOrTimeSchedule
from sharedstream.timetables.base import (
    DataInterval,
    InvalidTimetable,
    NaiveDatetime,
    TimeRestriction,
    Timetable,
    TimetableRegistry,
    UnregisteredTimetableClass,
    deserialize_timetable,
    serialize_timetable,
)
from sharedstream.timetables.events import EventsTimetable
from sharedstream.timetables.trigger import CronTriggerTimetable
from tests.timetables.tables import run_afters, runs

CHICAGO = ZoneInfo("America/Chicago")
LONG_AFTER = datetime(2030, 1, 1, tzinfo=UTC)


def games(**kwargs: object) -> EventsTimetable:
    """The seed's baseball games, given out of order and with one twice."""
    return EventsTimetable(
        [datetime(2022, 4, 22, 20, 50, tzinfo=CHICAGO), datetime(2022, 4, 5, 8, 27, tzinfo=CHICAGO),
         datetime(2022, 4, 17, 8, 27, tzinfo=CHICAGO), datetime(2022, 4, 5, 8, 27, tzinfo=CHICAGO)],
        **kwargs,  # type: ignore[arg-type]
    )


def test_events_run_in_order_once_each_as_exact_instants() -> None:
    got = runs(games(), 9, now=LONG_AFTER, catchup=True, tz=CHICAGO)
    assert got == [
        ("2022-04-05T08:27-05:00",) * 3,
        ("2022-04-17T08:27-05:00",) * 3,
        ("2022-04-22T20:50-05:00",) * 3,
    ]


def test_events_without_catchup_skip_the_past_and_respect_start_and_end() -> None:
    assert run_afters(runs(games(), 9, now=datetime(2022, 4, 10, tzinfo=CHICAGO), tz=CHICAGO)) == [
        "2022-04-17T08:27-05:00", "2022-04-22T20:50-05:00"]
    # An event exactly now is still due.
    assert run_afters(runs(games(), 1, now=datetime(2022, 4, 17, 8, 27, tzinfo=CHICAGO),
                           tz=CHICAGO)) == ["2022-04-17T08:27-05:00"]
    assert run_afters(runs(games(), 9, now=LONG_AFTER, catchup=True, tz=CHICAGO,
                           earliest=datetime(2022, 4, 17, 8, 27, tzinfo=CHICAGO),
                           latest=datetime(2022, 4, 20, tzinfo=CHICAGO))) == [
        "2022-04-17T08:27-05:00"]
    last = DataInterval.exact(datetime(2022, 4, 17, 8, 27, tzinfo=CHICAGO))
    assert run_afters(runs(games(), 9, now=LONG_AFTER, catchup=True, last=last,
                           tz=CHICAGO)) == ["2022-04-22T20:50-05:00"]
    assert runs(EventsTimetable([]), 1, now=LONG_AFTER, catchup=True) == []


@pytest.mark.parametrize(("triggered", "expected"), [
    (datetime(2022, 4, 1, tzinfo=CHICAGO), datetime(2022, 4, 5, 8, 27, tzinfo=CHICAGO)),
    (datetime(2022, 4, 17, 8, 27, tzinfo=CHICAGO), datetime(2022, 4, 17, 8, 27, tzinfo=CHICAGO)),
    (datetime(2022, 4, 20, tzinfo=CHICAGO), datetime(2022, 4, 17, 8, 27, tzinfo=CHICAGO)),
    (datetime(2023, 1, 1, tzinfo=CHICAGO), datetime(2022, 4, 22, 20, 50, tzinfo=CHICAGO)),
])
def test_restrict_to_events_makes_manual_runs_cover_an_event(triggered: datetime,
                                                             expected: datetime) -> None:
    assert games(restrict_to_events=True).infer_manual_data_interval(
        run_after=triggered) == DataInterval.exact(expected)
    assert games().infer_manual_data_interval(run_after=triggered) == DataInterval.exact(triggered)


def test_events_description_summary_and_validation() -> None:
    assert games().summary == "3 events"
    assert games().description == (
        "3 events between 2022-04-05T13:27:00+00:00 and 2022-04-23T01:50:00+00:00")
    named = games(description="My Team's Baseball Games")
    assert named.summary == named.description == "My Team's Baseball Games"
    assert EventsTimetable([]).description == "No events"
    with pytest.raises(InvalidTimetable, match="presorted=True but event"):
        games(presorted=True)
    with pytest.raises(NaiveDatetime, match="event date"):
        EventsTimetable([datetime(2022, 4, 5)])


# -- AssetOrTimeSchedule ------------------------------------------------------------------------


WEDNESDAY_0100 = CronTriggerTimetable("0 1 * * 3", timezone="UTC")


def test_asset_or_time_delegates_time_and_exposes_the_condition() -> None:
    dag1_asset, dag2_asset = Asset("dag1_asset"), Asset("dag2_asset")
    schedule = AssetOrTimeSchedule(timetable=WEDNESDAY_0100, assets=dag1_asset & dag2_asset)
    assert isinstance(schedule.asset_condition, AssetAll)
    assert schedule.asset_condition.to_tree() == {
        "all": [{"asset": "dag1_asset"}, {"asset": "dag2_asset"}]}
    assert schedule.summary == "Asset or 0 1 * * 3"
    assert schedule.description == "Triggered by assets or At 01:00 on Wednesday"
    now = datetime(2026, 1, 1, tzinfo=UTC)  # a Thursday
    assert runs(schedule, 2, now=now) == runs(WEDNESDAY_0100, 2, now=now) == [
        ("2026-01-07T01:00+00:00",) * 3, ("2026-01-14T01:00+00:00",) * 3]
    assert schedule.generate_run_id(
        run_type="asset_triggered", run_after=now, data_interval=None) == (
        "asset_triggered__2026-01-01T00:00:00+00:00")
    as_list = AssetOrTimeSchedule(timetable=WEDNESDAY_0100, assets=[dag1_asset, dag2_asset])
    assert as_list == schedule


def test_asset_or_time_refuses_what_it_cannot_combine() -> None:
    either = Asset("a") | Asset("b")
    assert isinstance(either, AssetAny)
    inner = AssetOrTimeSchedule(timetable=WEDNESDAY_0100, assets=either)
    with pytest.raises(InvalidTimetable, match="cannot be nested"):
        AssetOrTimeSchedule(timetable=inner, assets=either)
    with pytest.raises(InvalidTimetable, match="assets must be an Asset"):
        AssetOrTimeSchedule(timetable=WEDNESDAY_0100, assets=[])
    with pytest.raises(InvalidTimetable, match="timetable must be a Timetable"):
        AssetOrTimeSchedule(timetable="0 1 * * 3", assets=either)  # type: ignore[arg-type]


class NotRegistered(Timetable):
    """A custom timetable no registry knows."""

    def next_dagrun_info(self, *, last_automated_data_interval: DataInterval | None,
                         restriction: TimeRestriction) -> None:
        return None

    def infer_manual_data_interval(self, *, run_after: datetime) -> DataInterval:
        return DataInterval.exact(run_after)


def test_the_nested_timetable_is_checked_against_the_same_registry() -> None:
    registry = TimetableRegistry()
    registry.load_entry_points()
    schedule = AssetOrTimeSchedule(timetable=NotRegistered(), assets=Asset("a") | Asset("b"))
    stored = serialize_timetable(schedule)
    with pytest.raises(UnregisteredTimetableClass, match="NotRegistered"):
        deserialize_timetable(stored, registry)
    registry.register(f"{__name__}.NotRegistered", NotRegistered)
    rebuilt = deserialize_timetable(stored, registry)
    assert rebuilt == schedule
    assert isinstance(rebuilt, AssetOrTimeSchedule)
    assert rebuilt.asset_condition.to_tree() == {"any": [{"asset": "a"}, {"asset": "b"}]}
    with pytest.raises(RuntimeError, match="needs a registry"):
        deserialize_timetable(stored)


def test_the_interval_of_a_manual_asset_or_time_run_is_the_timetable_s() -> None:
    schedule = AssetOrTimeSchedule(
        timetable=CronTriggerTimetable("0 1 * * 3", timezone="UTC", interval=timedelta(days=7)),
        assets=Asset("a"))
    assert schedule.infer_manual_data_interval(run_after=LONG_AFTER) == DataInterval(
        LONG_AFTER - timedelta(days=7), LONG_AFTER)
