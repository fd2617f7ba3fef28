"""The producer errors every broker module derives its own from.

One hierarchy, rooted at :class:`BrokerError` (itself a
:class:`~sharedstream.engine.errors.SharedStreamError`), named after what went
wrong. A broker module subclasses each one it raises with its own prefix
(``KafkaConfigError(KafkaProducerError, BrokerConfigError)``), so callers can
catch either "anything from Kafka" or "a configuration problem, whatever the
broker". SDK errors are wrapped at the producer boundary (``raise ... from
exc``); ``retryable`` says whether running the same work again can help.
"""

from __future__ import annotations

from sharedstream.engine.errors import SharedStreamError

__all__ = [
    "BrokerConfigError",
    "BrokerConnectError",
    "BrokerDeadLetterError",
    "BrokerError",
    "BrokerRequestError",
]


class BrokerError(SharedStreamError):
    """Base class of the errors a broker module's producer raises."""


class BrokerConfigError(BrokerError, ValueError):
    """The settings are unusable, or the broker's SDK extra is not installed; fix the config.

    Not retryable: the same settings fail the same way.
    """


class BrokerConnectError(BrokerError):
    """The broker could not be reached after bounded retries."""

    retryable = True


class BrokerRequestError(BrokerError):
    """A broker call (fetch, commit, delete, ...) failed after bounded retries.

    The poll ends; what was not advanced is redelivered.
    """

    retryable = True


class BrokerDeadLetterError(BrokerError):
    """A message could not be dead-lettered; it was not advanced past, so it comes again."""

    retryable = True
