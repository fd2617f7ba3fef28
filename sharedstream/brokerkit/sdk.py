"""Lazy import of a broker's SDK, with the one-line "install the extra" error.

A broker module is importable without its SDK (so are its trigger and every
definitions file naming it); the SDK is imported the first time the producer
needs it. :class:`OptionalSdk` holds the broker's package and extra names and
turns a missing package into the broker's configuration error, telling the
user which ``pip install`` fixes it.

The kit names no SDK itself: the broker module passes its own module names,
so importing the kit never loads one.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from sharedstream.brokerkit.errors import BrokerConfigError

__all__ = ["OptionalSdk"]


class OptionalSdk:
    """The SDK of one broker, imported on first use.

    ``package`` is the distribution's top-level module (``"aiokafka"``),
    ``extra`` the sharedstream extra that installs it (``"kafka"``), ``error``
    the broker's :class:`BrokerConfigError` subclass raised when it is
    missing, ``user`` who needs it, in that error (default: the
    producer). Stateless apart from the import system's own cache; safe to
    call from any thread.
    """

    def __init__(self, *, broker: str, package: str, extra: str,
                 error: type[BrokerConfigError] = BrokerConfigError,
                 user: str | None = None) -> None:
        self.broker, self.package, self.extra, self.error = broker, package, extra, error
        self.user = user or f"the {broker} producer"
        """Who needs the SDK, at the head of the error (``the Kafka producer``)."""

    def __call__(self, module: str | None = None) -> ModuleType:
        """Import ``module`` (the package itself by default) and return it.

        Raises ``error`` (a ``ValueError``) from the ``ImportError`` when the
        extra is not installed. Call it in the producer's constructor to fail
        there, before the engine takes charge, rather than at connect time.
        """
        try:
            return importlib.import_module(module or self.package)
        except ImportError as exc:
            raise self.error(
                f"{self.user} needs {self.package}: "
                f"pip install 'sharedstream[{self.extra}]'"
            ) from exc
