"""Trigger timetables: a run *at* each schedule point (``airflow.timetables.trigger``).

:class:`CronTriggerTimetable` runs at each point of a cron expression,
:class:`DeltaTriggerTimetable` every ``delta``, and
:class:`MultipleCronTriggerTimetable` at each point of any of several cron
expressions. A run's data interval is ``[run_after - interval, run_after]``
(empty by default), so its logical date is ``run_after - interval``.

How the next run is chosen (``t`` is the answer's ``run_after``):

* with catch-up: the point after the last run's ``run_after``; before the
  first run, the first point at or after ``earliest`` (or, with no start
  date, the first run described below);
* without catch-up: the latest of the point after the last run, the first
  point at or after ``earliest``, and the *first run* as of now - so points
  that passed while nothing ran are skipped. For a cron timetable the first
  run is the next point from now, unless ``run_immediately`` says to run the
  most recent past point (``True``: always; a ``timedelta``: if it passed no
  longer ago than that; ``None``: if it passed no longer ago than a tenth of
  the gap between points, and at least five minutes). For a ``timedelta``
  timetable it is the most recent point at or before now, the points
  being ``start date + k * delta`` (the Unix epoch standing in for a
  missing start date), so run ids stay aligned to the start date; for a
  ``relativedelta`` timetable it is now.
* no run if ``t`` is after ``latest``.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from sharedstream.timetables._schedule import (
    CronSteps,
    DeltaSteps,
    Steps,
    check_interval,
    last_point,
)
from sharedstream.timetables.base import (
    DagRunInfo,
    DataInterval,
    TimeRestriction,
    Timetable,
    cron_presets,
    utcnow,
)
from sharedstream.timetables.values import (
    Delta,
    InvalidTimetable,
    check_delta,
    decode_delta,
    decode_timezone,
    encode_delta,
    encode_timezone,
    parse_timezone,
    require_aware,
)

__all__ = ["CronTriggerTimetable", "DeltaTriggerTimetable", "MultipleCronTriggerTimetable"]

RunImmediately = bool | dt.timedelta | None


class _TriggerTimetable(Timetable):
    """The choice of the next run shared by the trigger timetables (module docstring)."""

    _steps: Steps
    _interval: Delta

    def _first_run(self, now: dt.datetime, anchor: dt.datetime | None) -> dt.datetime:
        """The first run without catch-up as of ``now``; ``anchor`` is the start date."""
        raise NotImplementedError

    def infer_manual_data_interval(self, *, run_after: dt.datetime) -> DataInterval:
        """``[run_after - interval, run_after]``."""
        end = require_aware(run_after, "run_after")
        return DataInterval((end - self._interval).astimezone(dt.UTC), end)

    def next_dagrun_info(
        self,
        *,
        last_automated_data_interval: DataInterval | None,
        restriction: TimeRestriction,
    ) -> DagRunInfo | None:
        """The next run, by the rules of the module docstring."""
        earliest = _optional(restriction.earliest, "restriction.earliest")
        latest = _optional(restriction.latest, "restriction.latest")
        after_last = None
        if last_automated_data_interval is not None:
            last_end = require_aware(last_automated_data_interval.end, "the last run's end")
            after_last = self._steps.after(last_end)
        candidates: list[dt.datetime] = []
        if restriction.catchup:
            if after_last is not None:
                candidates.append(after_last)
            elif earliest is not None:
                candidates.append(self._steps.align_up(earliest))
            else:
                candidates.append(self._first_run(utcnow(), earliest))
        else:
            candidates.append(self._first_run(utcnow(), earliest))
            if after_last is not None:
                candidates.append(after_last)
            if earliest is not None:
                candidates.append(self._steps.align_up(earliest))
        run_after = max(candidates)
        if latest is not None and run_after > latest:
            return None
        start = (run_after - self._interval).astimezone(dt.UTC)
        return DagRunInfo(run_after, DataInterval(start, run_after))


class CronTriggerTimetable(_TriggerTimetable):
    """Runs at each point of ``cron`` in ``timezone`` (a preset such as ``"@daily"`` works too).

    ``interval`` (a ``timedelta`` or ``relativedelta``, default none) gives
    each run the data interval that ends at the run; ``run_immediately``
    decides whether a DAG without catch-up runs the most recent past point
    when it starts (see the module docstring; default ``False``: wait for
    the next point).
    """

    def __init__(
        self,
        cron: str,
        *,
        timezone: str | dt.tzinfo,
        interval: Delta = dt.timedelta(),
        run_immediately: RunImmediately = False,
    ) -> None:
        self._expression = cron_presets.get(cron, cron) if isinstance(cron, str) else cron
        self._timezone = parse_timezone(timezone)
        self._cron = CronSteps(self._expression, self._timezone)
        self._steps = self._cron
        self._interval = check_interval(interval)
        if not isinstance(run_immediately, bool | dt.timedelta | None):
            raise TypeError(
                "run_immediately must be True, False, None or a timedelta, got "
                f"{type(run_immediately).__qualname__}"
            )
        self._run_immediately = run_immediately
        self.description = self._cron.description

    @property
    def summary(self) -> str:
        """The cron expression."""
        return self._expression

    def _first_run(self, now: dt.datetime, anchor: dt.datetime | None) -> dt.datetime:
        upcoming = self._steps.align_up(now)
        if upcoming == now or self._run_immediately is False:
            return upcoming
        past = self._steps.before(now)
        if self._run_immediately is True:
            return past
        if isinstance(self._run_immediately, dt.timedelta):
            window = self._run_immediately
        else:
            window = max((upcoming - past) / 10, dt.timedelta(minutes=5))
        return past if now - past <= window else upcoming

    def serialize(self) -> dict[str, Any]:
        """Expression, timezone, interval and ``run_immediately``."""
        run_immediately = self._run_immediately
        return {
            "expression": self._expression,
            "timezone": encode_timezone(self._timezone),
            "interval": encode_delta(self._interval),
            "run_immediately": (
                {"seconds": run_immediately.total_seconds()}
                if isinstance(run_immediately, dt.timedelta) else run_immediately
            ),
        }

    @classmethod
    def deserialize(cls, data: dict[str, Any]) -> CronTriggerTimetable:
        """Inverse of :meth:`serialize`."""
        return cls(
            data["expression"],
            timezone=decode_timezone(data["timezone"]),
            interval=decode_delta(data["interval"]),
            run_immediately=_decode_run_immediately(data["run_immediately"]),
        )


class DeltaTriggerTimetable(_TriggerTimetable):
    """Runs every ``delta`` (a ``timedelta`` or ``relativedelta``, applied in UTC).

    ``interval`` gives each run the data interval that ends at the run. The
    first run without catch-up is the start date, if later than now, else
    the most recent ``start date + k * delta`` (for a ``relativedelta``:
    now); see the module docstring.
    """

    def __init__(self, delta: Delta, *, interval: Delta = dt.timedelta()) -> None:
        self._delta = check_delta(delta, "delta")
        self._steps = DeltaSteps(self._delta)
        self._interval = check_interval(interval)

    @property
    def summary(self) -> str:
        """The delta, as Python prints it."""
        return str(self._delta) if isinstance(self._delta, dt.timedelta) else repr(self._delta)

    def _first_run(self, now: dt.datetime, anchor: dt.datetime | None) -> dt.datetime:
        if isinstance(self._delta, dt.timedelta):
            return last_point(self._delta, now, anchor)
        return now

    def serialize(self) -> dict[str, Any]:
        """Delta and interval."""
        return {"delta": encode_delta(self._delta), "interval": encode_delta(self._interval)}

    @classmethod
    def deserialize(cls, data: dict[str, Any]) -> DeltaTriggerTimetable:
        """Inverse of :meth:`serialize`."""
        return cls(decode_delta(data["delta"]), interval=decode_delta(data["interval"]))


class MultipleCronTriggerTimetable(Timetable):
    """Runs at each point of any of ``crons``; points shared by several make one run.

    Takes the same ``timezone``, ``interval`` and ``run_immediately`` as
    :class:`CronTriggerTimetable`, for every expression. With catch-up the
    next run is the earliest any expression proposes; without, the latest
    proposal that is already due, or else the earliest one to come.
    """

    def __init__(
        self,
        *crons: str,
        timezone: str | dt.tzinfo,
        interval: Delta = dt.timedelta(),
        run_immediately: RunImmediately = False,
    ) -> None:
        if not crons:
            raise InvalidTimetable("MultipleCronTriggerTimetable needs a cron expression")
        self._timetables = [
            CronTriggerTimetable(cron, timezone=timezone, interval=interval,
                                 run_immediately=run_immediately)
            for cron in crons
        ]
        self.description = "; ".join(t.description for t in self._timetables)

    @property
    def summary(self) -> str:
        """The cron expressions, comma-separated."""
        return ", ".join(t.summary for t in self._timetables)

    def infer_manual_data_interval(self, *, run_after: dt.datetime) -> DataInterval:
        """``[run_after - interval, run_after]`` (every expression shares the interval)."""
        return self._timetables[0].infer_manual_data_interval(run_after=run_after)

    def next_dagrun_info(
        self,
        *,
        last_automated_data_interval: DataInterval | None,
        restriction: TimeRestriction,
    ) -> DagRunInfo | None:
        """The next run of any expression (see the class docstring for which one)."""
        proposals = [
            info for t in self._timetables
            if (info := t.next_dagrun_info(
                last_automated_data_interval=last_automated_data_interval,
                restriction=restriction,
            )) is not None
        ]
        if not proposals:
            return None
        if restriction.catchup:
            return min(proposals, key=lambda info: info.run_after)
        now = utcnow()
        due = [info for info in proposals if info.run_after <= now]
        if due:
            return max(due, key=lambda info: info.run_after)
        return min(proposals, key=lambda info: info.run_after)

    def serialize(self) -> dict[str, Any]:
        """The expressions and the shared settings."""
        first = self._timetables[0].serialize()
        return {
            "expressions": [t.summary for t in self._timetables],
            "timezone": first["timezone"],
            "interval": first["interval"],
            "run_immediately": first["run_immediately"],
        }

    @classmethod
    def deserialize(cls, data: dict[str, Any]) -> MultipleCronTriggerTimetable:
        """Inverse of :meth:`serialize`."""
        return cls(
            *data["expressions"],
            timezone=decode_timezone(data["timezone"]),
            interval=decode_delta(data["interval"]),
            run_immediately=_decode_run_immediately(data["run_immediately"]),
        )


def _optional(value: dt.datetime | None, what: str) -> dt.datetime | None:
    return None if value is None else require_aware(value, what)


def _decode_run_immediately(data: Any) -> RunImmediately:
    if isinstance(data, dict):
        return dt.timedelta(seconds=data["seconds"])
    if data is None or isinstance(data, bool):
        return data
    raise InvalidTimetable(f"stored run_immediately {data!r} is not a bool, None or a delta")
