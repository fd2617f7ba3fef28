"""Data-interval timetables: a run *after* each period ends (``airflow.timetables.interval``).

:class:`CronDataIntervalTimetable` cuts time into periods between
consecutive points of a cron expression, :class:`DeltaDataIntervalTimetable`
into periods of ``delta``. Each run covers one period - its data interval
``[start, end]`` - and is queued when the period has ended
(``run_after == end``); its logical date is the period's start.

How the next period is chosen:

* after a run, the period that starts where the last one ended (aligned
  down to the schedule, in case the schedule changed);
* before the first run, the period that starts at ``earliest`` (aligned up
  to the schedule); with catch-up and no start date there is no first run;
* without catch-up, never a period that starts before the latest period
  that has already ended: missed periods are skipped, and the most recent
  complete one runs at once. For a cron schedule that is the period ending
  at the last point at or before now; for a ``timedelta`` schedule, the
  period ending at the last ``start date + k * delta`` at or before now
  (the Unix epoch standing in for a missing start date), so periods stay
  aligned to the start date; for a ``relativedelta``, the period ending at
  now rounded down to a whole number of ``delta`` since the Unix epoch
  (months counted as 30 days, years as 365);
* no run if the period starts after ``latest``.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from dateutil.relativedelta import relativedelta

from sharedstream.timetables._schedule import CronSteps, DeltaSteps, Steps, last_point
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
    check_delta,
    decode_delta,
    decode_timezone,
    encode_delta,
    encode_timezone,
    parse_timezone,
    require_aware,
)

__all__ = ["CronDataIntervalTimetable", "DeltaDataIntervalTimetable"]


class _DataIntervalTimetable(Timetable):
    """The choice of the next period shared by both data-interval timetables."""

    _steps: Steps

    def _latest_start(self, now: dt.datetime, anchor: dt.datetime | None) -> dt.datetime:
        """The start of the latest period that has ended by ``now``; ``anchor``: the start date."""
        raise NotImplementedError

    def next_dagrun_info(
        self,
        *,
        last_automated_data_interval: DataInterval | None,
        restriction: TimeRestriction,
    ) -> DagRunInfo | None:
        """The next period, by the rules of the module docstring."""
        earliest = None
        if restriction.earliest is not None:
            earliest = self._steps.align_up(
                require_aware(restriction.earliest, "restriction.earliest"))
        if not restriction.catchup:
            latest_start = self._latest_start(utcnow(), earliest)
            earliest = latest_start if earliest is None else max(earliest, latest_start)
        if last_automated_data_interval is None:
            if earliest is None:
                return None
            start = earliest
        else:
            last_end = require_aware(last_automated_data_interval.end, "the last run's end")
            start = self._steps.align_down(last_end)
            if earliest is not None:
                start = max(start, earliest)
        if restriction.latest is not None and start > require_aware(
                restriction.latest, "restriction.latest"):
            return None
        return DagRunInfo.interval(start, self._steps.after(start))


class CronDataIntervalTimetable(_DataIntervalTimetable):
    """Periods between consecutive points of ``cron`` in ``timezone``; a run after each one.

    Airflow's ``schedule="<cron>"`` with ``create_cron_data_intervals = True``.
    """

    def __init__(self, cron: str, timezone: str | dt.tzinfo) -> None:
        self._expression = cron_presets.get(cron, cron) if isinstance(cron, str) else cron
        self._timezone = parse_timezone(timezone)
        self._steps = CronSteps(self._expression, self._timezone)
        self.description = self._steps.description

    @property
    def summary(self) -> str:
        """The cron expression."""
        return self._expression

    def _latest_start(self, now: dt.datetime, anchor: dt.datetime | None) -> dt.datetime:
        return self._steps.before(self._steps.align_down(now))

    def infer_manual_data_interval(self, *, run_after: dt.datetime) -> DataInterval:
        """The last complete period at ``run_after`` (daily, by hand at 01:00: yesterday)."""
        end = self._steps.align_down(require_aware(run_after, "run_after"))
        return DataInterval(self._steps.before(end), end)

    def serialize(self) -> dict[str, Any]:
        """Expression and timezone."""
        return {"expression": self._expression, "timezone": encode_timezone(self._timezone)}

    @classmethod
    def deserialize(cls, data: dict[str, Any]) -> CronDataIntervalTimetable:
        """Inverse of :meth:`serialize`."""
        return cls(data["expression"], decode_timezone(data["timezone"]))


class DeltaDataIntervalTimetable(_DataIntervalTimetable):
    """Periods of ``delta`` (a ``timedelta`` or ``relativedelta``); a run after each one.

    Airflow's ``schedule=<timedelta>`` with ``create_delta_data_intervals = True``.
    Periods follow the start date (or the last run), not clock boundaries.
    """

    def __init__(self, delta: Delta) -> None:
        self._delta = check_delta(delta, "delta")
        self._steps = DeltaSteps(self._delta)

    @property
    def summary(self) -> str:
        """The delta, as Python prints it."""
        return str(self._delta) if isinstance(self._delta, dt.timedelta) else repr(self._delta)

    def _latest_start(self, now: dt.datetime, anchor: dt.datetime | None) -> dt.datetime:
        if isinstance(self._delta, dt.timedelta):  # the period that ended at the last point
            return self._steps.before(last_point(self._delta, now, anchor))
        step = _approximate_seconds(self._delta)
        if step <= 0:  # only absolute fields (hour=18): no period length to round to
            return self._steps.before(now)
        seconds = now.timestamp()
        rounded = dt.datetime.fromtimestamp(seconds - seconds % step, dt.UTC)
        return self._steps.before(rounded)

    def infer_manual_data_interval(self, *, run_after: dt.datetime) -> DataInterval:
        """``[run_after - delta, run_after]``."""
        end = require_aware(run_after, "run_after")
        return DataInterval(self._steps.before(end), end)

    def serialize(self) -> dict[str, Any]:
        """The delta."""
        return {"delta": encode_delta(self._delta)}

    @classmethod
    def deserialize(cls, data: dict[str, Any]) -> DeltaDataIntervalTimetable:
        """Inverse of :meth:`serialize`."""
        return cls(decode_delta(data["delta"]))


def _approximate_seconds(delta: relativedelta) -> float:
    days = delta.years * 365 + delta.months * 30 + delta.days
    return float(days * 86400 + delta.hours * 3600 + delta.minutes * 60 + delta.seconds)
