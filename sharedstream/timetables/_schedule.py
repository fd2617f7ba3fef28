"""The two kinds of step a timetable takes: to the next cron point, or by a delta.

A :class:`Steps` answers four questions about an aware UTC moment: the
schedule point strictly after it (:meth:`~Steps.after`), strictly before it
(:meth:`~Steps.before`), and the point at or after / at or before it
(:meth:`~Steps.align_up`, :meth:`~Steps.align_down`). Every answer is aware
and in UTC.

Cron points come from `cronsim <https://pypi.org/project/cronsim/>`_,
evaluated in the schedule's timezone; cronsim follows Debian's cron across
daylight-saving changes (a job whose time falls in the skipped hour runs
right after the jump; a job at a specific hour runs once in a repeated hour;
jobs that run every hour or more often follow the wall clock through both).

A delta step adds a ``timedelta`` or ``relativedelta`` in UTC; a delta that
leaves a moment where it is would schedule the same run for ever, so it is
refused (at construction for the 168 hourly moments of one week, and at the
moment it happens otherwise). A ``timedelta`` schedule's points are
``anchor + k * delta`` for whole ``k`` (:func:`last_point`): the
anchor is the start date, or the Unix epoch without one, never "now", so
run ids carry no stray seconds or microseconds.
"""

from __future__ import annotations

import datetime as dt
from typing import Protocol

from cronsim import CronSim, CronSimError

from sharedstream.timetables.values import Delta, InvalidTimetable, check_delta

_PROBE_WEEK = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)  # a Monday
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_NO_MATCH = "matches no moment in the next 50 years"


class Steps(Protocol):
    """How a timetable moves through time (see the module docstring)."""

    def after(self, moment: dt.datetime) -> dt.datetime:
        """The first schedule point strictly after ``moment``."""
        ...

    def before(self, moment: dt.datetime) -> dt.datetime:
        """The last schedule point strictly before ``moment``."""
        ...

    def align_up(self, moment: dt.datetime) -> dt.datetime:
        """``moment`` if it is a schedule point, else :meth:`after`."""
        ...

    def align_down(self, moment: dt.datetime) -> dt.datetime:
        """``moment`` if it is a schedule point, else :meth:`before`."""
        ...


class CronSteps:
    """The points of a five-field cron expression in a timezone."""

    def __init__(self, expression: str, timezone: dt.tzinfo) -> None:
        if not isinstance(expression, str):
            raise TypeError(f"a cron expression must be a str, got {type(expression).__qualname__}")
        fields = expression.split()
        if len(fields) != 5:
            raise InvalidTimetable(
                f"bad cron expression {expression!r}: it has {len(fields)} fields, a cron "
                "expression has 5 (minute hour day-of-month month day-of-week)"
            )
        try:
            probe = CronSim(expression, _PROBE_WEEK)
            self.description = probe.explain()
            next(probe)
        except CronSimError as exc:
            raise InvalidTimetable(
                f"bad cron expression {expression!r}: {str(exc).lower()}"
            ) from exc
        except StopIteration:
            raise InvalidTimetable(f"cron expression {expression!r} {_NO_MATCH}") from None
        self.expression = expression
        self.timezone = timezone

    def _step(self, moment: dt.datetime, *, reverse: bool) -> dt.datetime:
        local = moment.astimezone(self.timezone)
        try:
            found = next(CronSim(self.expression, local, reverse=reverse))
        except StopIteration:
            raise InvalidTimetable(
                f"cron expression {self.expression!r} {_NO_MATCH} from {moment.isoformat()}"
            ) from None
        return found.astimezone(dt.UTC)

    def after(self, moment: dt.datetime) -> dt.datetime:
        """The first cron point strictly after ``moment``."""
        return self._step(moment, reverse=False)

    def before(self, moment: dt.datetime) -> dt.datetime:
        """The last cron point strictly before ``moment``."""
        # cronsim walks back from the start of the minute; step from one
        # microsecond on so a moment inside a matching minute is not missed.
        found = self._step(moment, reverse=True)
        return found if found < moment else self._step(found, reverse=True)

    def align_up(self, moment: dt.datetime) -> dt.datetime:
        """``moment`` if it is a cron point, else the next one."""
        following = self.after(moment)
        return moment if self.before(following) == moment else following

    def align_down(self, moment: dt.datetime) -> dt.datetime:
        """``moment`` if it is a cron point, else the previous one."""
        preceding = self.before(moment)
        return moment if self.after(preceding) == moment else preceding


def check_interval(interval: object) -> Delta:
    """``interval`` if it is a delta that does not go back in time (a data interval's length)."""
    delta = check_delta(interval, "interval")
    if _PROBE_WEEK - delta > _PROBE_WEEK:
        raise InvalidTimetable(f"interval {delta!r} is negative; a data interval cannot end "
                               "before it starts")
    return delta


def last_point(delta: dt.timedelta, moment: dt.datetime,
               anchor: dt.datetime | None) -> dt.datetime:
    """The last ``anchor + k * delta`` at or before ``moment`` (``anchor`` if it is later).

    ``anchor`` ``None`` means the Unix epoch (as Airflow rounds a delta
    schedule). Only for a ``timedelta``: a ``relativedelta``'s steps have no
    fixed length to count from an anchor. Exact (integer microseconds).
    """
    start = _EPOCH if anchor is None else anchor.astimezone(dt.UTC)
    if moment <= start:
        return start
    return start + delta * ((moment - start) // delta)


class DeltaSteps:
    """Steps of a fixed ``timedelta`` or a ``relativedelta``, taken in UTC; every moment aligns."""

    def __init__(self, delta: Delta, what: str = "delta") -> None:
        self.delta = delta
        self.what = what
        for hour in range(7 * 24):
            self.after(_PROBE_WEEK + dt.timedelta(hours=hour))

    def after(self, moment: dt.datetime) -> dt.datetime:
        """``moment + delta``; :class:`InvalidTimetable` if that does not move forward."""
        following = (moment + self.delta).astimezone(dt.UTC)
        if following <= moment:
            raise InvalidTimetable(
                f"{self.what} {self.delta!r} does not move {moment.isoformat()} forward; a "
                "schedule delta must move every moment forward (for 'the next Friday at 18:00' "
                "write relativedelta(days=+1, weekday=FR, hour=18, minute=0, second=0))"
            )
        return following

    def before(self, moment: dt.datetime) -> dt.datetime:
        """``moment - delta``."""
        return (moment - self.delta).astimezone(dt.UTC)

    def align_up(self, moment: dt.datetime) -> dt.datetime:
        """``moment``: a delta schedule has no fixed points."""
        return moment

    def align_down(self, moment: dt.datetime) -> dt.datetime:
        """``moment``: a delta schedule has no fixed points."""
        return moment
