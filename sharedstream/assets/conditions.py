"""What a DAG can be scheduled on: assets, their combinations, and their watchers.

An :class:`Asset` is a named piece of data; its :class:`AssetWatcher` s turn
a trigger's events into asset events. ``a & b`` (:class:`AssetAll`) and
``a | b`` (:class:`AssetAny`) combine assets into an
:class:`AssetCondition`, which a DAG is scheduled on directly or, beside a
timetable, through :class:`~sharedstream.timetables.assets.AssetOrTimeSchedule`.
A condition is stored as its schedule tree (``{"asset": name}``,
``{"all": [...]}``, ``{"any": [...]}``; :meth:`AssetCondition.to_tree`).

This module sits under both the timetables and the runtime, and imports
neither: the runtime's definitions loader
(:mod:`sharedstream.runtime.definitions`) collects what a definitions file
declares through :func:`declarations`, and the timetables build conditions
from these classes.

Invariants: a combination is flat (``(a & b) & c`` has three parts, not
two) and holds conditions only, else :class:`DefinitionsError`; an asset's
name is a non-empty string; while :func:`declarations` is open, every
:class:`Asset` constructed is noted, in order, exactly once.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from sharedstream.engine.errors import SharedStreamError
from sharedstream.engine.trigger import BaseEventTrigger

__all__ = [
    "Asset",
    "AssetAll",
    "AssetAny",
    "AssetCondition",
    "AssetWatcher",
    "DefinitionsError",
    "Schedule",
    "declarations",
    "declare",
]

_declared: list[object] | None = None
"""While :func:`declarations` is open: every Asset and Dag constructed meanwhile."""


@contextmanager
def declarations() -> Iterator[list[object]]:
    """Collect what is declared inside the block: the list of Assets and Dags, in order.

    The definitions loader opens it around the import of one definitions
    file. Not reentrant (one file is imported at a time); the collection
    ends when the block does, whether or not it raised.
    """
    global _declared  # noqa: PLW0603 - set only for the duration of one block
    built: list[object] = []
    _declared = built
    try:
        yield built
    finally:
        _declared = None


def declare(obj: object) -> None:
    """Note ``obj`` (an Asset or a Dag, just built) if :func:`declarations` is open."""
    if _declared is not None:
        _declared.append(obj)


class DefinitionsError(SharedStreamError):
    """A definitions file could not be used; the message names the file, object and reason."""


class AssetCondition:
    """Something a DAG can be scheduled on: an asset or a combination of assets.

    Combine with ``|`` (:class:`AssetAny`) and ``&`` (:class:`AssetAll`);
    stored as its schedule tree (:meth:`to_tree`).
    """

    def __or__(self, other: AssetCondition) -> AssetAny:
        """Either condition."""
        return AssetAny(self, other)

    def __and__(self, other: AssetCondition) -> AssetAll:
        """Both conditions."""
        return AssetAll(self, other)

    def to_tree(self) -> dict[str, Any]:
        """The JSON-able schedule tree stored with the DAG."""
        raise NotImplementedError

    def assets(self) -> Iterator[Asset]:
        """Every asset this condition mentions."""
        raise NotImplementedError


class Asset(AssetCondition):
    """A named piece of data; its watchers turn external events into asset events."""

    def __init__(self, name: str, *, watchers: Sequence[AssetWatcher] = ()) -> None:
        if not isinstance(name, str) or not name:
            raise DefinitionsError(f"Asset name must be a non-empty string, got {name!r}")
        self.name = name
        self.watchers = list(watchers)
        declare(self)

    def to_tree(self) -> dict[str, Any]:
        """``{"asset": name}``."""
        return {"asset": self.name}

    def assets(self) -> Iterator[Asset]:
        """Just this asset."""
        yield self

    def __repr__(self) -> str:
        return f"Asset({self.name!r})"


class AssetAll(AssetCondition):
    """Satisfied when every part has new events (``a & b``, or a list of assets)."""

    def __init__(self, *parts: AssetCondition) -> None:
        self.parts = _flatten(AssetAll, parts)

    def to_tree(self) -> dict[str, Any]:
        """``{"all": [parts]}``."""
        return {"all": [part.to_tree() for part in self.parts]}

    def assets(self) -> Iterator[Asset]:
        """Every asset of every part."""
        for part in self.parts:
            yield from part.assets()


class AssetAny(AssetCondition):
    """Satisfied when any part has new events (``a | b``)."""

    def __init__(self, *parts: AssetCondition) -> None:
        self.parts = _flatten(AssetAny, parts)

    def to_tree(self) -> dict[str, Any]:
        """``{"any": [parts]}``."""
        return {"any": [part.to_tree() for part in self.parts]}

    def assets(self) -> Iterator[Asset]:
        """Every asset of every part."""
        for part in self.parts:
            yield from part.assets()


def _flatten(kind: type[AssetCondition], parts: Sequence[AssetCondition]) -> list[AssetCondition]:
    flat: list[AssetCondition] = []
    for part in parts:
        if not isinstance(part, AssetCondition):
            raise DefinitionsError(
                f"a schedule can combine assets only, got {type(part).__qualname__}"
            )
        flat.extend(part.parts if isinstance(part, kind) else [part])  # type: ignore[attr-defined]
    return flat


Schedule = AssetCondition | Sequence[AssetCondition]


class AssetWatcher:
    """Runs ``trigger``; every event it fires becomes an event of the asset it is attached to."""

    def __init__(self, name: str, trigger: BaseEventTrigger) -> None:
        self.name = name
        self.trigger = trigger

    def __repr__(self) -> str:
        return f"AssetWatcher({self.name!r}, trigger={self.trigger!r})"
