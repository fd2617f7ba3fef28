"""What a user asks the runtime to watch: assets, their watchers, and DAGs scheduled on them.

A *definitions file* is a Python file that builds these objects when it is
imported (assigned to a name or not)::

    orders = Asset("orders", watchers=[AssetWatcher("big", trigger=KafkaTrigger(...))])
    refunds = Asset("refunds", watchers=[...])
    Dag("reconcile", schedule=orders & refunds)   # both must have new events
    Dag("notify", schedule=orders | refunds)      # either one
    Dag("audit", schedule=[orders, refunds])      # a list means all of them
    Dag("nightly", schedule="0 2 * * *", start_date=datetime(2026, 1, 1, tzinfo=UTC))
    Dag("tick", schedule=timedelta(minutes=5))    # or a Timetable, or AssetOrTimeSchedule

:func:`load_definitions` imports the file, collects every :class:`Asset` and
:class:`Dag` it defines, checks them (unknown assets, duplicate names,
triggers and timetables that cannot be stored) and reports any problem as
one :class:`DefinitionsError` naming the file, the object and the reason.
Identical watcher triggers (same class path and kwargs) collapse into one
trigger: they are the same upstream filter. A file needs at least one
watcher or one Dag (a file of time-scheduled DAGs alone is useful).

It also takes several files, and folders (like Airflow's DAGs folder):
every ``*.py`` file under a folder, in path order, except names starting
with ``_`` or ``.``; a file of a folder that declares nothing is a helper
module and is skipped. What they declare is one set of definitions: an
asset declared in two files is one asset, a Dag may be scheduled on an
asset another file watches, and a Dag id defined in two files is an error
naming both. Files are imported as modules named after their stem, so
two files of one stem are refused.

The asset classes (:class:`Asset`, its watchers and combinations) are
:mod:`sharedstream.assets`'s, handed on here; ``Dag`` and the loader are
this module's.
"""

from __future__ import annotations

import datetime as dt
import importlib.util
import re
import sys
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from dateutil.relativedelta import relativedelta

from sharedstream.assets.conditions import (
    Asset,
    AssetAll,
    AssetAny,
    AssetCondition,
    AssetWatcher,
    DefinitionsError,
    Schedule,
    declarations,
    declare,
)
from sharedstream.engine.errors import SharedStreamError
from sharedstream.engine.trigger import BaseEventTrigger, BaseTrigger
from sharedstream.runtime.registry import TriggerRegistry
from sharedstream.runtime.serde import SerializationError, kwargs_fingerprint, pack_kwargs
from sharedstream.timetables.assets import AssetTriggeredTimetable
from sharedstream.timetables.base import (
    Timetable,
    TimetableRegistry,
    classpath_of,
    deserialize_timetable,
    serialize_timetable,
)
from sharedstream.timetables.from_schedule import timetable_for

__all__ = [
    "Asset",
    "AssetAll",
    "AssetAny",
    "AssetWatcher",
    "Dag",
    "Definitions",
    "DefinitionsError",
    "WatchedTrigger",
    "load_definitions",
    "timetable_registry",
]

DEFINITIONS_PACKAGE = "sharedstream_definitions"
"""Definitions files are imported as ``sharedstream_definitions.<file stem>``."""


class Dag:
    """A DAG the runtime queues runs of: on assets, on time, or on either (Airflow's ``DAG``).

    ``schedule`` is one of:

    * an :class:`Asset`, a non-empty list of assets (all of them must have
      new events) or an expression built with ``|`` (any) and ``&`` (all);
    * a cron expression or preset (``"0 2 * * *"``, ``"@daily"``; a
      ``CronTriggerTimetable`` in the timezone of ``start_date``, else UTC),
      a ``timedelta`` or ``relativedelta`` (a ``DeltaTriggerTimetable``), or
      any :class:`~sharedstream.timetables.base.Timetable`;
    * an ``AssetOrTimeSchedule`` (its timetable and its asset condition
      each queue their own runs, whichever comes first);
    * an ``AssetTriggeredTimetable`` (Airflow 3.4's): its asset condition,
      with its ``batch_asset_events`` unless this Dag's own is given (the
      two differing is an error);
    * ``None``: nothing queues runs of it (listed, never scheduled).

    ``start_date`` and ``end_date`` (timezone-aware; a naive one is refused)
    bound its time-based runs; ``catchup`` (default ``False``, as in Airflow
    3) queues the runs missed since the last one, in order.

    Where its runs go (``docs/dispatch.md``): ``run`` is what runs each of
    them here, on the built-in ``local`` target - a callable taking the
    :class:`~sharedstream.dispatch.document.RunDocument` (a function or a
    coroutine function), or a command line (a list of strings, the run
    document on its standard input). ``target`` names another target (a
    ``[targets.<name>]`` of the configuration, or ``"local"``);
    ``target_options`` overrides the options of that target a DAG may set
    (an Airflow target's ``mode``, say). A DAG with neither ``run`` nor
    ``target`` goes to ``[dispatch] default_target``, if one is set, else
    its runs wait in the store.

    Batching (Airflow 3.4's ``batch_asset_events``): by default each asset
    event that satisfies the schedule makes a run (an ``&`` condition
    gathers what it needs first). ``batch_asset_events=True`` makes the
    runs batches instead: one run consumes what the DAG's queue holds,
    made within about a second, or when ``max_events`` asset events are
    queued, or once the oldest has waited ``max_wait`` (a ``timedelta`` or
    seconds); giving either implies batching. ``None`` takes ``[scheduler]
    batch_asset_events``.

    Raises :class:`DefinitionsError` (one line naming the DAG) for anything
    else.

    After construction: :attr:`asset_condition` is the condition the asset
    path evaluates (or ``None``), :attr:`timetable` the timetable the
    schedule loop asks (or ``None``), and :attr:`schedule` the condition, the
    timetable, or ``None``.
    """

    def __init__(
        self,
        dag_id: str,
        *,
        schedule: (Schedule | str | dt.timedelta | relativedelta | Timetable
                   | AssetTriggeredTimetable | None),
        start_date: dt.datetime | None = None,
        end_date: dt.datetime | None = None,
        catchup: bool = False,
        run: Callable[..., Any] | Sequence[str] | None = None,
        target: str | None = None,
        target_options: Mapping[str, Any] | None = None,
        batch_asset_events: bool | None = None,
        max_events: int | None = None,
        max_wait: dt.timedelta | float | None = None,
    ) -> None:
        if not isinstance(dag_id, str) or not dag_id:
            raise DefinitionsError(f"Dag id must be a non-empty string, got {dag_id!r}")
        self.dag_id = dag_id
        self.run = _runnable(dag_id, run)
        if target is not None and (not isinstance(target, str) or not target):
            raise DefinitionsError(f"Dag {dag_id!r}: target must be a target's name (a "
                                   f"[targets.<name>] of the configuration, or 'local'), "
                                   f"got {target!r}")
        self.target = target
        if target_options is not None and (not isinstance(target_options, Mapping) or not all(
                isinstance(key, str) for key in target_options)):
            raise DefinitionsError(f"Dag {dag_id!r}: target_options must be a dict of option "
                                   f"names to values, got {target_options!r}")
        self.target_options: dict[str, Any] = dict(target_options or {})
        if isinstance(schedule, AssetTriggeredTimetable):
            batch_asset_events = _one_batching(dag_id, batch_asset_events, schedule)
            schedule = schedule.asset_condition
        self.batch_asset_events, self.max_events, self.max_wait = _batching(
            dag_id, batch_asset_events, max_events, max_wait)
        self.start_date = _aware(dag_id, "start_date", start_date)
        self.end_date = _aware(dag_id, "end_date", end_date)
        if self.start_date and self.end_date and self.end_date < self.start_date:
            raise DefinitionsError(
                f"Dag {dag_id!r}: end_date {self.end_date.isoformat()} is before start_date "
                f"{self.start_date.isoformat()}"
            )
        if not isinstance(catchup, bool):
            raise DefinitionsError(f"Dag {dag_id!r}: catchup must be True or False, "
                                   f"got {catchup!r}")
        self.catchup = catchup
        self.asset_condition: AssetCondition | None = None
        self.timetable: Timetable | None = None
        if isinstance(schedule, AssetCondition):
            self.asset_condition = schedule
        elif isinstance(schedule, (list, tuple)) and schedule:
            self.asset_condition = AssetAll(*schedule)
        elif isinstance(schedule, str | dt.timedelta | relativedelta | Timetable):
            self.timetable = self._timetable(schedule)
            condition = self.timetable.asset_condition  # an AssetOrTimeSchedule's
            self.asset_condition = condition if isinstance(condition, AssetCondition) else None
        elif schedule is not None:
            raise DefinitionsError(
                f"Dag {dag_id!r}: schedule must be an Asset, a non-empty list of assets, "
                f"an expression with | and &, a cron expression, a timedelta, a Timetable "
                f"or None, got {schedule!r}"
            )
        self.schedule: AssetCondition | Timetable | None = (
            self.asset_condition if self.timetable is None else self.timetable)
        if self.batch_asset_events and self.asset_condition is None:
            raise DefinitionsError(f"Dag {dag_id!r}: batch_asset_events, max_events and "
                                   "max_wait apply to a DAG scheduled on assets")
        declare(self)

    def _timetable(self, schedule: str | dt.timedelta | relativedelta | Timetable) -> Timetable:
        # A cron schedule runs in the start date's timezone (Airflow's rule).
        zone = self.start_date.tzinfo if self.start_date is not None else None
        try:
            return timetable_for(schedule, timezone=zone or "UTC")
        except SharedStreamError as exc:
            raise DefinitionsError(f"Dag {self.dag_id!r}: schedule {schedule!r}: {exc}") from exc

    def __repr__(self) -> str:
        return f"Dag({self.dag_id!r})"


def _one_batching(
    dag_id: str, given: bool | None, schedule: AssetTriggeredTimetable
) -> bool | None:
    """A Dag's ``batch_asset_events``: the one given, or its ``AssetTriggeredTimetable``'s.

    Both given and different is a :class:`DefinitionsError`.
    """
    if given is not None and schedule.batch_asset_events not in (None, given):
        raise DefinitionsError(f"Dag {dag_id!r}: batch_asset_events={given!r} contradicts its "
                               f"schedule's batch_asset_events="
                               f"{schedule.batch_asset_events!r}")
    return given if given is not None else schedule.batch_asset_events


def _batching(
    dag_id: str, batch: bool | None, max_events: int | None, max_wait: dt.timedelta | float | None,
) -> tuple[bool | None, int | None, float | None]:
    """A Dag's batching as given, checked: ``(batch_asset_events, max_events, max_wait s)``."""
    if batch is not None and not isinstance(batch, bool):
        raise DefinitionsError(f"Dag {dag_id!r}: batch_asset_events must be True, False or None, "
                               f"got {batch!r}")
    if max_events is not None and (isinstance(max_events, bool) or not isinstance(
            max_events, int) or max_events < 1):
        raise DefinitionsError(f"Dag {dag_id!r}: max_events must be a whole number >= 1, got "
                               f"{max_events!r}")
    seconds = max_wait.total_seconds() if isinstance(max_wait, dt.timedelta) else max_wait
    if seconds is not None and (isinstance(seconds, bool) or not isinstance(
            seconds, int | float) or seconds < 0):
        raise DefinitionsError(f"Dag {dag_id!r}: max_wait must be a timedelta or seconds >= 0, "
                               f"got {max_wait!r}")
    bounded = max_events is not None or seconds is not None
    if batch is False and bounded:
        raise DefinitionsError(f"Dag {dag_id!r}: max_events and max_wait bound batches; they "
                               "need batch_asset_events=True (or None)")
    return (True if bounded else batch), max_events, (
        None if seconds is None else float(seconds))


def _runnable(
    dag_id: str, run: Callable[..., Any] | Sequence[str] | None
) -> Callable[..., Any] | list[str] | None:
    """A Dag's ``run=`` as given (a callable) or as a list (a command line), or an error."""
    if run is None or callable(run):
        return run
    if (isinstance(run, Sequence) and not isinstance(run, str) and run
            and all(isinstance(part, str) and part for part in run)):
        return list(run)
    raise DefinitionsError(f"Dag {dag_id!r}: run must be a function (it gets the run document) "
                           f'or a command line such as ["python", "job.py"], got {run!r}')


def _aware(dag_id: str, what: str, value: dt.datetime | None) -> dt.datetime | None:
    """``value`` as given (aware), or a :class:`DefinitionsError` for a naive or non-datetime."""
    if value is None:
        return None
    if not isinstance(value, dt.datetime):
        raise DefinitionsError(f"Dag {dag_id!r}: {what} must be a datetime, got {value!r}")
    if value.tzinfo is None or value.utcoffset() is None:
        raise DefinitionsError(
            f"Dag {dag_id!r}: {what} {value.isoformat()} has no timezone; give an aware "
            "datetime (e.g. datetime(2026, 1, 1, tzinfo=UTC))"
        )
    return value


@dataclass(frozen=True)
class WatchedTrigger:
    """One distinct trigger of the definitions and the (asset, watcher) pairs that use it."""

    fingerprint: str
    classpath: str
    kwargs: dict[str, Any]
    trigger_class: type[BaseTrigger]
    watchers: list[tuple[str, str]] = field(default_factory=list)
    pinned: bool = False
    """Identified otherwise than by its serialized form (``BaseTrigger.identity``): the store
    keeps the first registration's ``classpath`` and ``kwargs``."""
    queue: str | None = None
    """The trigger queue (``BaseTrigger.queue``): which triggerers run it."""


@dataclass(frozen=True)
class Definitions:
    """Everything the definitions files declare, checked."""

    path: Path
    assets: dict[str, Asset]
    dags: dict[str, Dag]
    triggers: dict[str, WatchedTrigger]
    trigger_classes: dict[str, type[BaseTrigger]]
    timetable_classes: dict[str, type[Timetable]] = field(default_factory=dict)
    """The timetable classes the file defines, by class path (registered like its triggers)."""
    timetables: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Each time-scheduled DAG's serialized timetable (``serialize_timetable``), by dag id."""
    sources: tuple[Path, ...] = ()
    """The files and folders the definitions were loaded from, as given (``path`` is the
    first)."""

    @property
    def source(self) -> str:
        """Where the definitions came from, for messages: the paths given, comma-separated."""
        return ", ".join(str(p) for p in self.sources or (self.path,))


def load_definitions(paths: Path | Sequence[Path]) -> Definitions:
    """Import the definitions at ``paths`` (files or folders) and check what they declare.

    Raises :class:`DefinitionsError` (one line, naming the file, the object
    and the reason) if a file is missing or fails to import, a file given by
    name declares neither a watcher nor a Dag, a folder holds no ``*.py``
    file, nothing at all is declared, two files share a stem, a Dag id is
    defined twice, a Dag names an asset no watcher feeds, a name is reused,
    a watcher's trigger is not an event trigger or cannot be serialized, or
    a Dag's timetable cannot be stored and rebuilt (its class must be a
    built-in, defined in a definitions file, or registered under the
    ``sharedstream.timetables`` entry-point group). See the module
    docstring for how files and folders combine.
    """
    given = [Path(paths)] if isinstance(paths, str | Path) else [Path(p) for p in paths]
    if not given:
        raise DefinitionsError("no definitions file given")
    where = ", ".join(str(Path(p).resolve()) for p in given)
    assets: dict[str, Asset] = {}
    dags: dict[str, Dag] = {}
    dag_files: dict[str, Path] = {}
    watchers: dict[str, list[AssetWatcher]] = {}
    modules: list[ModuleType] = []
    files = _definition_files(given)
    for path, in_folder in files:
        module, built = _import_file(path)
        declared = False
        for value in built:  # every Asset and Dag the file built, assigned to a name or not
            if isinstance(value, Asset):
                # Assets are identified by name: Asset("orders") in a schedule is
                # the same asset as the one declared with watchers.
                assets.setdefault(value.name, value)
                known = watchers.setdefault(value.name, [])
                known.extend(w for w in value.watchers if not any(w is k for k in known))
                declared = declared or bool(value.watchers)
            elif isinstance(value, Dag):
                if value.dag_id in dags:
                    other = dag_files[value.dag_id]
                    raise DefinitionsError(
                        f"{path}: Dag id {value.dag_id!r} is used twice" if other == path else
                        f"{path}: Dag id {value.dag_id!r} is also defined in {other}")
                dags[value.dag_id], dag_files[value.dag_id] = value, path
                declared = True
        if not declared and not in_folder:
            raise DefinitionsError(
                f"{path}: defines no Asset with a watcher and no Dag; nothing to watch or schedule")
        modules.append(module)
    if not any(watchers.values()) and not dags:
        raise DefinitionsError(
            f"{where}: defines no Asset with a watcher and no Dag; nothing to watch or schedule")
    for dag in dags.values():
        for asset in dag.asset_condition.assets() if dag.asset_condition else ():
            if not watchers.get(asset.name):
                raise DefinitionsError(
                    f"{dag_files[dag.dag_id]}: Dag {dag.dag_id!r} is scheduled on asset "
                    f"{asset.name!r}, which no watcher in "
                    f"{'this file' if len(files) == 1 else 'the definitions'} feeds (a typo "
                    "in the asset name?)"
                )
    triggers = _collect_triggers(where, watchers)
    classes = {
        f"{cls.__module__}.{cls.__qualname__}": cls
        for module in modules for cls in vars(module).values()
        if isinstance(cls, type)
        and issubclass(cls, BaseTrigger)
        and cls.__module__ == module.__name__
    }
    _register_trigger_classes(triggers, classes)
    timetable_classes = {
        classpath_of(cls): cls
        for module in modules for cls in vars(module).values()
        if isinstance(cls, type) and issubclass(cls, Timetable)
        and cls.__module__ == module.__name__
    }
    timetables = _check_timetables(where, dags, timetable_classes)
    return Definitions(given[0].resolve(), assets, dags, triggers, classes, timetable_classes,
                       timetables, sources=tuple(p.resolve() for p in given))


def _definition_files(given: Sequence[Path]) -> list[tuple[Path, bool]]:
    """The files to import, each once, in order: ``(path, found in a folder)``.

    A folder gives every ``*.py`` file under it, sorted, except names (of
    files or folders) starting with ``_`` or ``.``. Two files of one stem
    are refused (each is imported as ``sharedstream_definitions.<stem>``).
    """
    files: dict[Path, bool] = {}
    for each in given:
        path = each.resolve()
        if path.is_dir():
            found = sorted(
                f for f in path.rglob("*.py")
                if not any(part.startswith(("_", ".")) for part in f.relative_to(path).parts))
            if not found:
                raise DefinitionsError(f"{path}: no definitions file (*.py) in this folder")
            for f in found:
                files.setdefault(f, True)
        else:
            files[path] = False  # named: must declare something, even if a folder has it too
    stems: dict[str, Path] = {}
    for path in files:
        other = stems.setdefault(path.stem, path)
        if other != path:
            raise DefinitionsError(f"{path}: another definitions file has the name "
                                   f"{path.name} ({other}); rename one")
    return list(files.items())


TRIGGER_QUEUE_NAME = re.compile(r"[A-Za-z0-9_.-]+")
"""What a trigger queue may be called (a name ``[triggerer] queues`` can list)."""


def _trigger_queue(trigger: BaseTrigger, where: str) -> str | None:
    """The trigger's queue (``trigger_queue()``), checked: ``None`` or a queue name."""
    queue = trigger.trigger_queue()
    if queue is not None and not (isinstance(queue, str)
                                  and TRIGGER_QUEUE_NAME.fullmatch(queue)):
        raise DefinitionsError(f"{where}: trigger queue {queue!r} must be a name (letters, "
                               "digits, '_', '.', '-') or None")
    return queue


def _register_trigger_classes(triggers: dict[str, WatchedTrigger],
                              classes: dict[str, type[BaseTrigger]]) -> None:
    """Add to ``classes`` the class each watched trigger is rebuilt as, by its class path.

    A class of the file keeps its path. A trigger serialized under the path
    of an installed class (``TimeDeltaTrigger`` as ``DateTimeTrigger``) is
    rebuilt as that class: the file's class must not take its place. Any
    other path a trigger chose for itself names its own class.
    """
    installed: TriggerRegistry | None = None
    for watched in triggers.values():
        path, cls = watched.classpath, watched.trigger_class
        if path in classes:
            continue
        if path != classpath_of(cls):
            if installed is None:
                installed = TriggerRegistry()
                installed.load_entry_points()
            if path in installed:
                continue
        classes[path] = cls


def timetable_registry(classes: dict[str, type[Timetable]]) -> TimetableRegistry:
    """The built-in and installed timetable classes (entry points) and ``classes``."""
    registry = TimetableRegistry()
    registry.load_entry_points()
    for classpath, cls in classes.items():
        registry.register(classpath, cls)
    return registry


def _check_timetables(
    path: Path | str, dags: dict[str, Dag], classes: dict[str, type[Timetable]]
) -> dict[str, dict[str, Any]]:
    """Each timetable serialized, checked to come back from a registered class."""
    registry = timetable_registry(classes)
    stored: dict[str, dict[str, Any]] = {}
    for dag in dags.values():
        if dag.timetable is None:
            continue
        try:
            data = serialize_timetable(dag.timetable)
            deserialize_timetable(data, registry)
        except Exception as exc:
            # Whatever the user's (or a plugin's) timetable raised: one line naming the DAG.
            raise DefinitionsError(
                f"{path}: Dag {dag.dag_id!r}: its timetable {type(dag.timetable).__qualname__} "
                f"cannot be stored: {type(exc).__name__}: {exc}"
            ) from exc
        stored[dag.dag_id] = data
    return stored


def _import_file(path: Path) -> tuple[ModuleType, list[object]]:
    if not path.is_file():
        raise DefinitionsError(f"{path}: definitions file not found")
    name = f"{DEFINITIONS_PACKAGE}.{path.stem}"
    if DEFINITIONS_PACKAGE not in sys.modules:
        package = ModuleType(DEFINITIONS_PACKAGE)
        package.__path__ = []
        sys.modules[DEFINITIONS_PACKAGE] = package
    # Like Airflow's DAG folder: modules beside the definitions file import by name.
    folder = str(path.resolve().parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise DefinitionsError(f"{path}: cannot be imported as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    with declarations() as built:
        try:
            spec.loader.exec_module(module)
        except Exception as exc:
            # Whatever the user's module raised, it is reported, not re-raised:
            # the message carries the exception and the line it came from.
            del sys.modules[name]
            where = _user_frame(exc, path)
            raise DefinitionsError(
                f"{path}: failed to import{where}: {type(exc).__name__}: {exc}"
            ) from exc
    return module, built


def _user_frame(exc: BaseException, path: Path) -> str:
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if Path(f.filename) == path]
    return f" (line {frames[-1].lineno})" if frames else ""


def _collect_triggers(
    path: Path | str, watchers: dict[str, list[AssetWatcher]]
) -> dict[str, WatchedTrigger]:
    triggers: dict[str, WatchedTrigger] = {}
    for asset_name, asset_watchers in watchers.items():
        seen: set[str] = set()
        for watcher in asset_watchers:
            if not isinstance(watcher, AssetWatcher):
                raise DefinitionsError(f"{path}: asset {asset_name!r} has a watcher that is not "
                                       f"an AssetWatcher: {watcher!r}")
            where = f"{path}: watcher {watcher.name!r} of asset {asset_name!r}"
            if watcher.name in seen:
                raise DefinitionsError(f"{where}: the watcher name is used twice on this asset")
            seen.add(watcher.name)
            trigger = watcher.trigger
            if not isinstance(trigger, BaseEventTrigger):
                raise DefinitionsError(
                    f"{where}: trigger must be a BaseEventTrigger, got {type(trigger).__qualname__}"
                )
            try:
                classpath, kwargs = trigger.serialize()
                pack_kwargs(kwargs)
                identity = trigger.identity()
                fingerprint = kwargs_fingerprint(*identity)
            except SerializationError as exc:
                raise DefinitionsError(f"{where}: trigger cannot be serialized: {exc}") from exc
            except Exception as exc:
                # The user's serialize() itself failed; report it with the watcher.
                raise DefinitionsError(
                    f"{where}: {type(trigger).__qualname__}.serialize() raised "
                    f"{type(exc).__name__}: {exc}"
                ) from exc
            queue = _trigger_queue(trigger, where)
            watched = triggers.get(fingerprint)
            if watched is None:
                watched = triggers[fingerprint] = WatchedTrigger(
                    fingerprint, classpath, dict(kwargs), type(trigger),
                    pinned=identity != (classpath, kwargs), queue=queue,
                )
            elif watched.queue != queue:
                raise DefinitionsError(
                    f"{where}: the same trigger is declared in trigger queue {queue!r} here "
                    f"and in {watched.queue!r} by {'/'.join(watched.watchers[0])}; one trigger "
                    "runs in one queue")
            watched.watchers.append((asset_name, watcher.name))
    return triggers
