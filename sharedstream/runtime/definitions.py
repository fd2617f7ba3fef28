"""What a user asks the runtime to watch: assets, their watchers, and DAGs scheduled on them.

A *definitions file* is a Python file that builds these objects when it is
imported (assigned to a name or not)::

    orders = Asset("orders", watchers=[AssetWatcher("big", trigger=KafkaTrigger(...))])
    refunds = Asset("refunds", watchers=[...])
    Dag("reconcile", schedule=orders & refunds)   # both must have new events
    Dag("notify", schedule=orders | refunds)      # either one
    Dag("audit", schedule=[orders, refunds])      # a list means all of them

:func:`load_definitions` imports the file, collects every :class:`Asset` and
:class:`Dag` it defines, checks them (unknown assets, duplicate names,
triggers that cannot serialize) and reports any problem as one
:class:`DefinitionsError` naming the file, the object and the reason.
Identical watcher triggers (same class path and kwargs) collapse into one
trigger: they are the same upstream filter.
"""

from __future__ import annotations

import importlib.util
import sys
import traceback
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from sharedstream.engine.errors import SharedStreamError
from sharedstream.engine.trigger import BaseEventTrigger, BaseTrigger
from sharedstream.runtime.serde import SerializationError, kwargs_fingerprint, pack_kwargs

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
]

_building: list[object] | None = None
"""While a definitions file is imported: every Asset and Dag it constructs."""

DEFINITIONS_PACKAGE = "sharedstream_definitions"
"""Definitions files are imported as ``sharedstream_definitions.<file stem>``."""


class DefinitionsError(SharedStreamError):
    """A definitions file could not be used; the message names the file, object and reason."""


class _Condition:
    """Something a DAG can be scheduled on: an asset or a combination of assets."""

    def __or__(self, other: _Condition) -> AssetAny:
        """Either condition."""
        return AssetAny(self, other)

    def __and__(self, other: _Condition) -> AssetAll:
        """Both conditions."""
        return AssetAll(self, other)

    def to_tree(self) -> dict[str, Any]:
        """The JSON-able schedule tree stored with the DAG."""
        raise NotImplementedError

    def assets(self) -> Iterator[Asset]:
        """Every asset this condition mentions."""
        raise NotImplementedError


class Asset(_Condition):
    """A named piece of data; its watchers turn external events into asset events."""

    def __init__(self, name: str, *, watchers: Sequence[AssetWatcher] = ()) -> None:
        if not isinstance(name, str) or not name:
            raise DefinitionsError(f"Asset name must be a non-empty string, got {name!r}")
        self.name = name
        self.watchers = list(watchers)
        if _building is not None:
            _building.append(self)

    def to_tree(self) -> dict[str, Any]:
        """``{"asset": name}``."""
        return {"asset": self.name}

    def assets(self) -> Iterator[Asset]:
        """Just this asset."""
        yield self

    def __repr__(self) -> str:
        return f"Asset({self.name!r})"


class AssetAll(_Condition):
    """Satisfied when every part has new events (``a & b``, or a list of assets)."""

    def __init__(self, *parts: _Condition) -> None:
        self.parts = _flatten(AssetAll, parts)

    def to_tree(self) -> dict[str, Any]:
        """``{"all": [parts]}``."""
        return {"all": [part.to_tree() for part in self.parts]}

    def assets(self) -> Iterator[Asset]:
        """Every asset of every part."""
        for part in self.parts:
            yield from part.assets()


class AssetAny(_Condition):
    """Satisfied when any part has new events (``a | b``)."""

    def __init__(self, *parts: _Condition) -> None:
        self.parts = _flatten(AssetAny, parts)

    def to_tree(self) -> dict[str, Any]:
        """``{"any": [parts]}``."""
        return {"any": [part.to_tree() for part in self.parts]}

    def assets(self) -> Iterator[Asset]:
        """Every asset of every part."""
        for part in self.parts:
            yield from part.assets()


def _flatten(kind: type[_Condition], parts: Sequence[_Condition]) -> list[_Condition]:
    flat: list[_Condition] = []
    for part in parts:
        if not isinstance(part, _Condition):
            raise DefinitionsError(
                f"a schedule can combine assets only, got {type(part).__qualname__}"
            )
        flat.extend(part.parts if isinstance(part, kind) else [part])  # type: ignore[attr-defined]
    return flat


Schedule = _Condition | Sequence[_Condition]


class AssetWatcher:
    """Runs ``trigger``; every event it fires becomes an event of the asset it is attached to."""

    def __init__(self, name: str, trigger: BaseEventTrigger) -> None:
        self.name = name
        self.trigger = trigger

    def __repr__(self) -> str:
        return f"AssetWatcher({self.name!r}, trigger={self.trigger!r})"


class Dag:
    """A DAG scheduled on assets: each time its schedule is satisfied, one run is queued.

    ``schedule`` is an :class:`Asset`, a list of assets (all of them must
    have new events), or an expression built with ``|`` (any) and ``&`` (all).
    """

    def __init__(self, dag_id: str, *, schedule: Schedule) -> None:
        if not isinstance(dag_id, str) or not dag_id:
            raise DefinitionsError(f"Dag id must be a non-empty string, got {dag_id!r}")
        self.dag_id = dag_id
        if isinstance(schedule, _Condition):
            self.schedule: _Condition = schedule
        elif isinstance(schedule, (list, tuple)) and schedule:
            self.schedule = AssetAll(*schedule)
        else:
            raise DefinitionsError(
                f"Dag {dag_id!r}: schedule must be an Asset, a non-empty list of assets, "
                f"or an expression with | and &, got {schedule!r}"
            )
        if _building is not None:
            _building.append(self)

    def __repr__(self) -> str:
        return f"Dag({self.dag_id!r})"


@dataclass(frozen=True)
class WatchedTrigger:
    """One distinct trigger of the definitions and the (asset, watcher) pairs that use it."""

    fingerprint: str
    classpath: str
    kwargs: dict[str, Any]
    trigger_class: type[BaseTrigger]
    watchers: list[tuple[str, str]] = field(default_factory=list)


@dataclass(frozen=True)
class Definitions:
    """Everything one definitions file declares, checked."""

    path: Path
    assets: dict[str, Asset]
    dags: dict[str, Dag]
    triggers: dict[str, WatchedTrigger]
    trigger_classes: dict[str, type[BaseTrigger]]


def load_definitions(path: Path) -> Definitions:
    """Import the definitions file at ``path`` and check what it declares.

    Raises :class:`DefinitionsError` (one line, naming the file, the object
    and the reason) if the file is missing or fails to import, declares no
    asset, names an asset that is not defined in it, reuses a name, or holds
    a watcher whose trigger is not an event trigger or cannot be serialized.
    """
    path = Path(path).resolve()
    module, built = _import_file(path)
    assets: dict[str, Asset] = {}
    dags: dict[str, Dag] = {}
    watchers: dict[str, list[AssetWatcher]] = {}
    for value in built:  # every Asset and Dag the file built, assigned to a name or not
        if isinstance(value, Asset):
            # Assets are identified by name: Asset("orders") in a schedule is
            # the same asset as the one declared with watchers.
            assets.setdefault(value.name, value)
            known = watchers.setdefault(value.name, [])
            known.extend(w for w in value.watchers if not any(w is k for k in known))
        elif isinstance(value, Dag):
            if value.dag_id in dags:
                raise DefinitionsError(f"{path}: Dag id {value.dag_id!r} is used twice")
            dags[value.dag_id] = value
    if not any(watchers.values()):
        raise DefinitionsError(f"{path}: defines no Asset with a watcher; nothing to watch")
    for dag in dags.values():
        for asset in dag.schedule.assets():
            if not watchers.get(asset.name):
                raise DefinitionsError(
                    f"{path}: Dag {dag.dag_id!r} is scheduled on asset {asset.name!r}, which "
                    "no watcher in this file feeds (a typo in the asset name?)"
                )
    triggers = _collect_triggers(path, watchers)
    classes = {
        f"{cls.__module__}.{cls.__qualname__}": cls
        for cls in vars(module).values()
        if isinstance(cls, type)
        and issubclass(cls, BaseTrigger)
        and cls.__module__ == module.__name__
    }
    for watched in triggers.values():
        classes.setdefault(watched.classpath, watched.trigger_class)
    return Definitions(path, assets, dags, triggers, classes)


def _import_file(path: Path) -> tuple[ModuleType, list[object]]:
    global _building  # noqa: PLW0603 - set only for the duration of one import
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
    built: list[object] = []
    _building = built
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
    finally:
        _building = None
    return module, built


def _user_frame(exc: BaseException, path: Path) -> str:
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if Path(f.filename) == path]
    return f" (line {frames[-1].lineno})" if frames else ""


def _collect_triggers(
    path: Path, watchers: dict[str, list[AssetWatcher]]
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
                fingerprint = kwargs_fingerprint(classpath, kwargs)
            except SerializationError as exc:
                raise DefinitionsError(f"{where}: trigger cannot be serialized: {exc}") from exc
            except Exception as exc:
                # The user's serialize() itself failed; report it with the watcher.
                raise DefinitionsError(
                    f"{where}: {type(trigger).__qualname__}.serialize() raised "
                    f"{type(exc).__name__}: {exc}"
                ) from exc
            watched = triggers.get(fingerprint)
            if watched is None:
                watched = triggers[fingerprint] = WatchedTrigger(
                    fingerprint, classpath, dict(kwargs), type(trigger)
                )
            watched.watchers.append((asset_name, watcher.name))
    return triggers
