"""Time-based standalone triggers: fire once at a moment, or after a delay.

These are the smallest useful triggers and double as runnable examples of
a *standalone* trigger: they run their own ``run()`` and share no upstream
(no ``shared_stream_key``). They are event triggers, so an asset watcher can
use one - a scheduled one-off asset event; the triggerer marks such a
trigger finished after it fired and does not run it again:

* :class:`DateTimeTrigger` fires once at a timezone-aware moment, with that
  moment as the event payload.
* :class:`TimeDeltaTrigger` fires once a given delay after it was *created*.
  It serializes as a :class:`DateTimeTrigger` for the moment it computed, so
  a triggerer that rebuilds it from the metadata store (after a restart, or
  on another machine) keeps the original deadline instead of starting the
  countdown again. In an asset watcher it is identified by its delay
  (:meth:`TimeDeltaTrigger.identity`): it fires once, ``delta`` after the
  triggerer first registered it; loading the definitions again (a restart)
  neither moves the deadline nor makes it fire again, and a new delay is a
  new trigger.

Both wait with ``asyncio.sleep`` in chunks of at most
:attr:`DateTimeTrigger.max_sleep_seconds`, re-reading the wall clock between
chunks, so a clock jump (NTP step, suspended machine) delays firing by at
most one chunk. A moment already in the past fires at once.

Example::

    from datetime import UTC, datetime, timedelta
    from sharedstream.triggers.temporal import DateTimeTrigger, TimeDeltaTrigger

    at_noon = DateTimeTrigger(datetime(2030, 1, 1, 12, tzinfo=UTC))
    soon = TimeDeltaTrigger(timedelta(minutes=5))
    classpath, kwargs = soon.serialize()  # a DateTimeTrigger, moment fixed
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar

from sharedstream.engine.events import TriggerEvent
from sharedstream.engine.trigger import BaseEventTrigger

__all__ = ["DateTimeTrigger", "TimeDeltaTrigger"]

_DATETIME_TRIGGER_CLASSPATH = "sharedstream.triggers.temporal.DateTimeTrigger"


def _utcnow() -> datetime:
    """The current wall-clock time, timezone-aware (a seam for tests)."""
    return datetime.now(UTC)


class DateTimeTrigger(BaseEventTrigger):
    """Fire one :class:`TriggerEvent` whose payload is ``moment``, at ``moment``.

    ``moment`` must be a timezone-aware ``datetime`` (any tzinfo); a naive
    one raises ``ValueError`` and anything else ``TypeError``. ``run()``
    returns right after its single event; a moment in the past fires at once.
    """

    max_sleep_seconds: ClassVar[float] = 60.0
    """Longest single sleep; the wall clock is re-read after each one."""

    def __init__(self, moment: datetime) -> None:
        super().__init__()
        if not isinstance(moment, datetime):
            raise TypeError(
                f"{type(self).__name__}: `moment` must be a datetime, "
                f"got {type(moment).__qualname__}"
            )
        if moment.tzinfo is None or moment.utcoffset() is None:
            raise ValueError(
                f"{type(self).__name__}: `moment` must be timezone-aware, got naive {moment!r}; "
                "attach a tzinfo, e.g. moment.replace(tzinfo=datetime.UTC)"
            )
        self.moment = moment

    def serialize(self) -> tuple[str, dict[str, Any]]:
        """Return ``("sharedstream.triggers.temporal.DateTimeTrigger", {"moment": moment})``."""
        return _DATETIME_TRIGGER_CLASSPATH, {"moment": self.moment}

    async def run(self) -> AsyncIterator[TriggerEvent]:
        """Sleep until ``moment`` (in bounded chunks), then yield one event and return."""
        while True:
            remaining = (self.moment - _utcnow()).total_seconds()
            if remaining <= 0:
                break
            await asyncio.sleep(min(remaining, self.max_sleep_seconds))
        self.log.debug("moment reached", moment=self.moment.isoformat())
        yield TriggerEvent(self.moment)


class TimeDeltaTrigger(DateTimeTrigger):
    """Fire one :class:`TriggerEvent` ``delta`` after the trigger was constructed.

    The deadline ``now(UTC) + delta`` is fixed at construction and exposed as
    ``moment``; a zero or negative ``delta`` fires at once. ``serialize()``
    returns a :class:`DateTimeTrigger` classpath with that moment: rebuilding
    the trigger anywhere keeps the deadline rather than restarting the
    countdown, and the event payload is the deadline.
    """

    def __init__(self, delta: timedelta) -> None:
        if not isinstance(delta, timedelta):
            raise TypeError(
                f"TimeDeltaTrigger: `delta` must be a timedelta, got {type(delta).__qualname__}"
            )
        try:
            moment = _utcnow() + delta
        except OverflowError as exc:
            raise ValueError(
                f"TimeDeltaTrigger: `delta` {delta!r} puts the moment out of range"
            ) from exc
        super().__init__(moment)
        self.delta = delta

    def identity(self) -> tuple[str, dict[str, Any]]:
        """``("sharedstream.triggers.temporal.TimeDeltaTrigger", {"delta": delta})``.

        The moment is left out: it depends on when the definitions were
        loaded. The runtime keeps the moment of the first registration.
        """
        return "sharedstream.triggers.temporal.TimeDeltaTrigger", {"delta": self.delta}
