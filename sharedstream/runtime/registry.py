"""Which trigger classes may be rebuilt from the metadata database.

A trigger row stores a class path and encrypted kwargs. The runtime never
imports a class path read from the database: it rebuilds a trigger only
from a class registered here - the classes of the loaded definitions file
and those that installed packages declare under the
``sharedstream.triggers`` entry-point group. Anything else is refused with
:class:`UnregisteredTriggerClass`.
"""

from __future__ import annotations

from importlib.metadata import entry_points
from typing import Any

from sharedstream.engine.errors import SharedStreamError
from sharedstream.engine.keyvalue_log import key_value_logger
from sharedstream.engine.trigger import BaseTrigger

__all__ = ["ENTRY_POINT_GROUP", "TriggerRegistry", "UnregisteredTriggerClass"]

ENTRY_POINT_GROUP = "sharedstream.triggers"

log = key_value_logger("sharedstream.runtime")


class UnregisteredTriggerClass(SharedStreamError):
    """A stored trigger names a class that is not registered; it was not imported."""


class TriggerRegistry:
    """Maps class paths to the trigger classes allowed to be rebuilt."""

    def __init__(self) -> None:
        self._classes: dict[str, type[BaseTrigger]] = {}

    def register(self, classpath: str, cls: type[BaseTrigger]) -> None:
        """Allow ``classpath`` to be rebuilt as ``cls``."""
        if not (isinstance(cls, type) and issubclass(cls, BaseTrigger)):
            raise TypeError(f"{classpath}: {cls!r} is not a BaseTrigger subclass")
        self._classes[classpath] = cls

    def load_entry_points(self) -> None:
        """Register the classes installed packages declare under ``sharedstream.triggers``.

        The entry point's *value* names the class; both it and the class's
        own ``module.qualname`` path are registered. A broken entry point is
        logged and skipped, never fatal.
        """
        for entry in entry_points(group=ENTRY_POINT_GROUP):
            try:
                cls = entry.load()
                self.register(entry.value.replace(":", "."), cls)
                self.register(f"{cls.__module__}.{cls.__qualname__}", cls)
            except Exception:
                # A broken plugin must not stop the runtime; its triggers will
                # be refused as unregistered, with this log line as the cause.
                log.exception("trigger entry point could not be loaded", entry_point=entry.value)

    def __contains__(self, classpath: object) -> bool:
        return classpath in self._classes

    def rehydrate(self, classpath: str, kwargs: dict[str, Any]) -> BaseTrigger:
        """Build the trigger ``classpath(**kwargs)`` from a registered class.

        Raises :class:`UnregisteredTriggerClass` for any other class path
        (nothing is imported), and ``TypeError`` / ``ValueError`` from the
        constructor for kwargs it refuses.
        """
        cls = self._classes.get(classpath)
        if cls is None:
            raise UnregisteredTriggerClass(
                f"refusing to rebuild trigger class {classpath!r}: it is not defined in the "
                f"definitions file nor registered under the {ENTRY_POINT_GROUP!r} entry point "
                "group (class paths read from the database are never imported)"
            )
        return cls(**kwargs)
