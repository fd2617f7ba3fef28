"""A run at each of a list of moments (``airflow.timetables.events``).

:class:`EventsTimetable` suits irregular but known schedules (match days,
planned releases). The list is finite and kept whole in memory and in the
stored DAG, so keep it reasonably small.

Invariants: the events are aware, kept in UTC, in ascending order, without
duplicates; a run is the exact instant of one event (``run_after``,
logical date and both ends of the data interval are the event); events run
in order, each at most once (an event at or before the last run's end is
never proposed again); without catch-up, events already in the past are
skipped; events before ``earliest`` or after ``latest`` never run.
"""

from __future__ import annotations

import bisect
import datetime as dt
import itertools
from collections.abc import Iterable
from typing import Any

from sharedstream.timetables.base import (
    DagRunInfo,
    DataInterval,
    TimeRestriction,
    Timetable,
    utcnow,
)
from sharedstream.timetables.values import InvalidTimetable, require_aware

__all__ = ["EventsTimetable"]


class EventsTimetable(Timetable):
    """Runs at each of ``event_dates`` (aware datetimes; duplicates count once).

    ``restrict_to_events`` makes a manual run cover the most recent event at
    or before the moment it is triggered (the first event, if all are still
    to come) instead of that moment itself. ``presorted=True`` says the list
    is already in ascending order (it is checked, not re-sorted).
    ``description`` names the set of events in listings.
    """

    def __init__(
        self,
        event_dates: Iterable[dt.datetime],
        restrict_to_events: bool = False,
        presorted: bool = False,
        description: str | None = None,
    ) -> None:
        events = [require_aware(moment, "event date") for moment in event_dates]
        if presorted:
            for before, after in itertools.pairwise(events):
                if after < before:
                    raise InvalidTimetable(
                        f"presorted=True but event {after.isoformat()} comes after "
                        f"{before.isoformat()}"
                    )
        self.event_dates = sorted(set(events))
        self.restrict_to_events = bool(restrict_to_events)
        self._name = description
        if description is not None:
            self.description = description
        elif self.event_dates:
            self.description = (
                f"{len(self.event_dates)} events between {self.event_dates[0].isoformat()} "
                f"and {self.event_dates[-1].isoformat()}"
            )
        else:
            self.description = "No events"

    @property
    def summary(self) -> str:
        """The description given, or ``"<n> events"``."""
        return self._name if self._name is not None else f"{len(self.event_dates)} events"

    def next_dagrun_info(
        self,
        *,
        last_automated_data_interval: DataInterval | None,
        restriction: TimeRestriction,
    ) -> DagRunInfo | None:
        """The first event not yet run, not before ``earliest`` (nor, without catch-up, now)."""
        floor = None
        if restriction.earliest is not None:
            floor = require_aware(restriction.earliest, "restriction.earliest")
        if not restriction.catchup:
            now = utcnow()
            floor = now if floor is None else max(floor, now)
        index = 0 if floor is None else bisect.bisect_left(self.event_dates, floor)
        if last_automated_data_interval is not None:
            last_end = require_aware(last_automated_data_interval.end, "the last run's end")
            index = max(index, bisect.bisect_right(self.event_dates, last_end))
        if index >= len(self.event_dates):
            return None
        event = self.event_dates[index]
        if restriction.latest is not None and event > require_aware(
                restriction.latest, "restriction.latest"):
            return None
        return DagRunInfo.exact(event)

    def infer_manual_data_interval(self, *, run_after: dt.datetime) -> DataInterval:
        """The instant ``run_after``; with ``restrict_to_events``, the latest event up to it."""
        moment = require_aware(run_after, "run_after")
        if not self.restrict_to_events or not self.event_dates:
            return DataInterval.exact(moment)
        index = bisect.bisect_right(self.event_dates, moment) - 1
        return DataInterval.exact(self.event_dates[max(index, 0)])

    def serialize(self) -> dict[str, Any]:
        """The events (ISO 8601, UTC), ``restrict_to_events`` and the description given."""
        return {
            "event_dates": [moment.isoformat() for moment in self.event_dates],
            "restrict_to_events": self.restrict_to_events,
            "description": self._name,
        }

    @classmethod
    def deserialize(cls, data: dict[str, Any]) -> EventsTimetable:
        """Inverse of :meth:`serialize`."""
        return cls(
            [dt.datetime.fromisoformat(moment) for moment in data["event_dates"]],
            restrict_to_events=data["restrict_to_events"],
            presorted=True,
            description=data["description"],
        )
