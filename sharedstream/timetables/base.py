"""The timetable contract (Airflow's), run ids, and how timetables are stored and rebuilt.

A *timetable* decides when a time-based DAG runs and which *data interval*
each run covers. The runtime asks it one question, over and over:
:meth:`Timetable.next_dagrun_info` - "the last automated run covered this
interval; under this restriction (start date, end date, catch-up), what is
the next run?" - and queues the run it answers once ``run_after`` has
passed.

Invariants (each checked by a test in ``tests/timetables/``):

1. Every datetime in a :class:`DataInterval` or :class:`DagRunInfo` that a
   built-in timetable returns is aware and in UTC; naive datetimes are
   refused with :class:`~sharedstream.timetables.values.NaiveDatetime`.
2. ``next_dagrun_info`` is a pure function of its arguments and of the
   clock (:func:`utcnow`, which :func:`use_clock` replaces): asked the same
   question at the same time it gives the same answer, so a restarted
   runtime computes the same runs.
3. Fed its own answers back (``last_automated_data_interval`` = the data
   interval it returned), a built-in timetable's ``run_after`` strictly
   increases, and ``data_interval.end <= run_after``.
4. A run id is ``<run type>__<logical date, ISO 8601 in UTC>``
   (``scheduled__2026-01-02T18:00:00+00:00``): the same run always gets the
   same id, so a restart can never queue a time-based run twice.
5. A stored timetable is rebuilt only from a class registered in a
   :class:`TimetableRegistry` (the built-ins, classes of the loaded
   definitions file, classes installed packages declare under the
   ``sharedstream.timetables`` entry-point group). A class path read from the
   database is never imported: anything else is
   :class:`UnregisteredTimetableClass`.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from importlib.metadata import entry_points
from typing import Any, NamedTuple

from sharedstream.engine.errors import SharedStreamError
from sharedstream.engine.keyvalue_log import key_value_logger
from sharedstream.timetables.values import (
    InvalidTimetable,
    NaiveDatetime,
    require_aware,
)

__all__ = [
    "ENTRY_POINT_GROUP",
    "RUN_TYPES",
    "DagRunInfo",
    "DataInterval",
    "InvalidTimetable",
    "NaiveDatetime",
    "TimeRestriction",
    "Timetable",
    "TimetableRegistry",
    "UnregisteredTimetableClass",
    "cron_presets",
    "deserialize_timetable",
    "serialize_timetable",
    "use_clock",
    "utcnow",
]

ENTRY_POINT_GROUP = "sharedstream.timetables"

RUN_TYPES = ("scheduled", "manual", "backfill", "asset_triggered")
"""The run types a run id may start with (Airflow's ``DagRunType`` values)."""

cron_presets: dict[str, str] = {
    "@hourly": "0 * * * *",
    "@daily": "0 0 * * *",
    "@weekly": "0 0 * * 0",
    "@monthly": "0 0 1 * *",
    "@quarterly": "0 0 1 */3 *",
    "@yearly": "0 0 1 1 *",
}
"""Airflow's cron presets; ``@once`` is :class:`~sharedstream.timetables.simple.OnceTimetable`."""

log = key_value_logger("sharedstream.timetables")


class UnregisteredTimetableClass(SharedStreamError):
    """A stored timetable names a class that is not registered; it was not imported."""


# -- the clock ------------------------------------------------------------------------------------


def _system_now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


_clock: ContextVar[Callable[[], dt.datetime]] = ContextVar(
    "sharedstream_timetable_clock", default=_system_now
)


def utcnow() -> dt.datetime:
    """The current time as timetables see it (aware, UTC); see :func:`use_clock`."""
    return require_aware(_clock.get()(), "the clock's time")


@contextmanager
def use_clock(clock: Callable[[], dt.datetime] | dt.datetime) -> Iterator[None]:
    """Make :func:`utcnow` read ``clock`` (a callable, or a fixed aware datetime) inside the block.

    Tests and examples freeze time with it; the runtime passes its own
    injected clock. The setting is a context variable: it holds for the
    current thread or task and the tasks it starts, and is undone on exit.
    """
    if isinstance(clock, dt.datetime):
        moment = require_aware(clock, "the frozen time")

        def frozen() -> dt.datetime:
            return moment

        token = _clock.set(frozen)
    else:
        token = _clock.set(clock)
    try:
        yield
    finally:
        _clock.reset(token)


# -- the values the contract exchanges ------------------------------------------------------------


class DataInterval(NamedTuple):
    """The period of data a DAG run covers; ``start`` and ``end`` are aware (UTC)."""

    start: dt.datetime
    end: dt.datetime

    @classmethod
    def exact(cls, at: dt.datetime) -> DataInterval:
        """The empty interval at one instant (``start == end == at``)."""
        at = require_aware(at, "the data interval's instant")
        return cls(at, at)


class TimeRestriction(NamedTuple):
    """What bounds the next run: the DAG's start date, its end date, and catch-up.

    ``earliest`` and ``latest`` are inclusive (a run may fall exactly on
    either) and aware, or ``None`` for no bound. With ``catchup=False`` a
    timetable skips the runs whose time has passed (keeping at most the one
    its own rule allows, see each timetable); with ``catchup=True`` it
    continues from the last run (or from ``earliest``) in order.
    """

    earliest: dt.datetime | None
    latest: dt.datetime | None
    catchup: bool


class DagRunInfo(NamedTuple):
    """The next run: when it may start and what it covers."""

    run_after: dt.datetime
    """The earliest time the run may be queued (aware, UTC)."""

    data_interval: DataInterval
    """The data the run covers."""

    @property
    def logical_date(self) -> dt.datetime:
        """The run's logical date: the start of its data interval (Airflow's rule)."""
        return self.data_interval.start

    @classmethod
    def exact(cls, at: dt.datetime) -> DagRunInfo:
        """A run at ``at`` covering the instant ``at``."""
        interval = DataInterval.exact(at)
        return cls(interval.end, interval)

    @classmethod
    def interval(cls, start: dt.datetime, end: dt.datetime) -> DagRunInfo:
        """A run covering ``[start, end]``, queued as soon as the interval has ended."""
        start = require_aware(start, "the data interval's start")
        end = require_aware(end, "the data interval's end")
        return cls(end, DataInterval(start, end))


# -- the contract ---------------------------------------------------------------------------------


class Timetable:
    """Base class of every timetable: Airflow's contract, name for name.

    A subclass implements :meth:`next_dagrun_info` and
    :meth:`infer_manual_data_interval`, and - if its constructor takes
    arguments - :meth:`serialize` and :meth:`deserialize`. Instances must be
    immutable: the runtime may ask the same instance from several tasks.
    Two timetables are equal when they are of the same class and serialize
    to the same data.
    """

    description: str = ""
    """A human-readable description, such as ``"At 18:00 on Friday"``."""

    periodic: bool = True
    """Whether runs recur (``False`` for ``@once``-like timetables)."""

    can_be_scheduled: bool = True
    """Whether the timetable queues runs by itself at all."""

    asset_condition: object | None = None
    """For asset-or-time schedules: the asset condition that also queues runs."""

    @property
    def summary(self) -> str:
        """A short text for listings (``sharedstream dags list``): the class name by default."""
        return type(self).__name__

    def next_dagrun_info(
        self,
        *,
        last_automated_data_interval: DataInterval | None,
        restriction: TimeRestriction,
    ) -> DagRunInfo | None:
        """The next run after the last automated one, or ``None`` if no run is due to come.

        ``last_automated_data_interval`` is the data interval of the DAG's
        last scheduled run (manual runs do not count), ``None`` before the
        first. Called by the runtime each time it plans; must be
        deterministic given its arguments and :func:`utcnow`. ``None`` does
        not end the schedule for good: the runtime asks again later.
        """
        raise NotImplementedError

    def infer_manual_data_interval(self, *, run_after: dt.datetime) -> DataInterval:
        """The data interval of a run triggered by hand at ``run_after``."""
        raise NotImplementedError

    def serialize(self) -> dict[str, Any]:
        """The JSON-able data :meth:`deserialize` rebuilds this timetable from (``{}`` here)."""
        return {}

    @classmethod
    def deserialize(cls, data: dict[str, Any]) -> Timetable:
        """Rebuild a timetable from :meth:`serialize`'s data (the default calls ``cls()``)."""
        return cls()

    def validate(self) -> None:
        """Raise :class:`InvalidTimetable` if the timetable cannot work (constructors check)."""

    def generate_run_id(
        self, *, run_type: str, run_after: dt.datetime, data_interval: DataInterval | None
    ) -> str:
        """``<run_type>__<run_after ISO 8601, UTC>``: the same run always gets the same id.

        Built from ``run_after``, the moment the run is due, as Airflow 3 builds
        it (not from the logical date, which for a data-interval timetable is
        the interval's start; ``data_interval`` is accepted for overrides).
        """
        if run_type not in RUN_TYPES:
            raise ValueError(f"run type must be one of {', '.join(RUN_TYPES)}, got {run_type!r}")
        return f"{run_type}__{require_aware(run_after, 'run_after').isoformat()}"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Timetable):
            return NotImplemented
        return type(self) is type(other) and self.serialize() == other.serialize()

    def __hash__(self) -> int:
        return hash((type(self), json.dumps(self.serialize(), sort_keys=True)))

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.summary}>"


# -- storing and rebuilding -----------------------------------------------------------------------


def classpath_of(cls: type) -> str:
    """``module.QualName``: the path a timetable class is stored and registered under."""
    return f"{cls.__module__}.{cls.__qualname__}"


def serialize_timetable(timetable: Timetable) -> dict[str, Any]:
    """``{"classpath": ..., "data": timetable.serialize()}``, checked to be JSON-able."""
    if not isinstance(timetable, Timetable):
        raise TypeError(f"expected a Timetable, got {type(timetable).__qualname__}")
    classpath = classpath_of(type(timetable))
    data = timetable.serialize()
    try:
        json.dumps(data)
    except (TypeError, ValueError) as exc:
        raise InvalidTimetable(
            f"{classpath}.serialize() returned data that is not JSON-able: {exc}"
        ) from exc
    return {"classpath": classpath, "data": data}


def deserialize_timetable(
    data: dict[str, Any], registry: TimetableRegistry | None = None
) -> Timetable:
    """Rebuild what :func:`serialize_timetable` stored, from a class ``registry`` allows.

    Without ``registry``, the registry rebuilding the enclosing timetable is
    used: a timetable that holds another (``AssetOrTimeSchedule``) calls
    this from its ``deserialize``, and the inner class is checked against
    the same registry. Outside a rebuild that is a ``RuntimeError``.
    """
    if registry is None:
        registry = _rebuilding.get()
        if registry is None:
            raise RuntimeError("deserialize_timetable needs a registry outside a rebuild")
    return registry.rehydrate(data["classpath"], data["data"])


class TimetableRegistry:
    """Maps class paths to the timetable classes allowed to be rebuilt from storage.

    Works like the trigger registry: :meth:`load_entry_points` registers the
    built-ins and every class installed packages declare under the
    ``sharedstream.timetables`` entry-point group; the runtime
    :meth:`register` s the timetable classes of the loaded definitions file.
    """

    def __init__(self) -> None:
        self._classes: dict[str, type[Timetable]] = {}

    def register(self, classpath: str, cls: type[Timetable]) -> None:
        """Allow ``classpath`` to be rebuilt as ``cls``."""
        if not (isinstance(cls, type) and issubclass(cls, Timetable)):
            raise TypeError(f"{classpath}: {cls!r} is not a Timetable subclass")
        self._classes[classpath] = cls

    def load_entry_points(self) -> None:
        """Register the classes installed packages declare under ``sharedstream.timetables``.

        Both the entry point's value and the class's own ``module.qualname``
        are registered. A broken entry point is logged and skipped.
        """
        for entry in entry_points(group=ENTRY_POINT_GROUP):
            try:
                cls = entry.load()
                self.register(entry.value.replace(":", "."), cls)
                self.register(classpath_of(cls), cls)
            except Exception:
                # A broken plugin must not stop the runtime; DAGs using its
                # timetables are refused as unregistered, with this log as the cause.
                log.exception("timetable entry point could not be loaded", entry_point=entry.value)

    def __contains__(self, classpath: object) -> bool:
        return classpath in self._classes

    def rehydrate(self, classpath: str, data: dict[str, Any]) -> Timetable:
        """``cls.deserialize(data)`` for the class registered as ``classpath``.

        Raises :class:`UnregisteredTimetableClass` for any other class path
        (nothing is imported), and :class:`InvalidTimetable` for data the
        class cannot be rebuilt from.
        """
        cls = self._classes.get(classpath)
        if cls is None:
            raise UnregisteredTimetableClass(
                f"refusing to rebuild timetable class {classpath!r}: it is not a built-in, not "
                f"defined in the definitions file and not registered under the "
                f"{ENTRY_POINT_GROUP!r} entry point group (class paths read from the database "
                "are never imported)"
            )
        token = _rebuilding.set(self)
        try:
            return cls.deserialize(data)
        except (KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, SharedStreamError):
                raise
            raise InvalidTimetable(
                f"stored timetable {classpath!r} cannot be rebuilt from {data!r}: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        finally:
            _rebuilding.reset(token)


_rebuilding: ContextVar[TimetableRegistry | None] = ContextVar(
    "sharedstream_timetable_registry", default=None
)
