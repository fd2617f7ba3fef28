r"""Mirror of ``airflow.providers.common.messaging.triggers.msg_queue``: ``MessageQueueTrigger``.

``from airflow.providers.common.messaging.triggers.msg_queue import
MessageQueueTrigger`` ports as ``from
sharedstream.airflow.providers.common.messaging.triggers.msg_queue import
MessageQueueTrigger``. As in Airflow, the trigger is the one entry point for
every broker: the broker is picked by ``scheme`` and configured by the
keyword arguments of that broker's Airflow trigger::

    MessageQueueTrigger(scheme="kafka", topics=["orders"], apply_function="shop.is_paid")
    MessageQueueTrigger(scheme="sqs", sqs_queue="https://sqs.eu-west-1.amazonaws.com/1/orders")

Here each scheme is backed by a shared-stream trigger: the watchers of one
broker stream (same topics and connection; same queue, connection and
region) share one consumer, and the broker is advanced only once their
events are stored. Airflow runs one consumer per watcher.

The schemes (those of the providers' ``BaseMessageQueueProvider`` classes):

* ``kafka`` - :class:`~._kafka.KafkaMessageQueueTrigger`, taking
  ``AwaitMessageTrigger``'s arguments;
* ``sqs`` - :class:`~._sqs.SqsMessageQueueTrigger`, taking
  ``SqsSensorTrigger``'s arguments;
* ``google+pubsub``, ``azure+servicebus`` and ``kinesis`` are recognised
  and refused with one line naming the trigger to use instead.

The two spellings of ``queue`` (Airflow 3.4 changed its meaning):

* with ``scheme``, ``queue`` is the *trigger queue* (Airflow 3.4,
  common-messaging 2.2): which triggerers run the trigger. ``trigger_queue``
  (common-messaging 2.1) is the same and may be given instead;
* without ``scheme``, ``queue`` is the broker URI of common-messaging 2.1
  (deprecated there): ``kafka://<host>/<topic>,<topic>`` (the topics; the
  broker comes from the connection) or an SQS queue URL
  ``https://sqs.<region>.amazonaws.com/<account>/<name>``.

Where they conflict - ``scheme`` given and ``queue`` a URI, which 2.1 read
as the broker URI - 3.4 wins, and since no trigger queue is named like a
URI it is refused with one line rather than taken as a queue name.

Building a ``MessageQueueTrigger`` gives an instance of the scheme's class
(a subclass), as Airflow's gives a trigger that serializes as the
provider's: the stored trigger is the broker's, rebuilt from its
``serialize()`` kwargs (``scheme``, the broker arguments with their
defaults, and ``queue`` when a trigger queue is set). Differences from
Airflow are listed in ``docs/airflow.md``.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import AsyncIterator, Mapping
from typing import Any, ClassVar

from sharedstream.engine.events import TriggerEvent
from sharedstream.engine.trigger import BaseEventTrigger

__all__ = ["MessageQueueTrigger"]

SCHEMES: Mapping[str, str] = {
    "kafka": "sharedstream.airflow.providers.common.messaging.triggers._kafka."
             "KafkaMessageQueueTrigger",
    "sqs": "sharedstream.airflow.providers.common.messaging.triggers._sqs.SqsMessageQueueTrigger",
}
"""Each scheme served here and the class backing it (imported when first used)."""

NOT_SERVED: Mapping[str, str] = {
    "google+pubsub": "sharedstream.triggers.pubsub.PubSubSharedStreamTrigger(subscription=..., "
                     "project=..., conn_id=<gcp_conn_id>)",
    "azure+servicebus": "sharedstream.triggers.servicebus.ServiceBusSharedStreamTrigger("
                        "queue=..., conn_id=<azure_service_bus_conn_id>)",
    "kinesis": "nothing: sharedstream has no Kinesis producer",
}
"""Schemes Airflow's providers serve that ``MessageQueueTrigger`` does not, and what to use."""

_QUEUE_URIS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"^kafka://"), "kafka"),
    (re.compile(r"^https://sqs\.[^.]+\.amazonaws\.com(\.cn)?/[0-9]+/.+"), "sqs"),
)
"""common-messaging 2.1's broker URIs (``queue=`` without ``scheme``) and their schemes."""


def _scheme_of_uri(uri: str) -> str:
    for pattern, scheme in _QUEUE_URIS:
        if pattern.match(uri):
            return scheme
    raise ValueError(f"MessageQueueTrigger: queue={uri!r} is not a broker URI served here "
                     "(kafka://<host>/<topics> or https://sqs.<region>.amazonaws.com/<account>/"
                     "<name>); give scheme= and the broker's arguments")


def _backing_class(scheme: str) -> type[MessageQueueTrigger]:
    """The class serving ``scheme``; ``ValueError`` naming the alternative when none does."""
    path = SCHEMES.get(scheme)
    if path is None:
        instead = NOT_SERVED.get(scheme)
        if instead is not None:
            raise ValueError(f"MessageQueueTrigger: scheme {scheme!r} is not served here; "
                             f"use {instead}")
        raise ValueError(f"MessageQueueTrigger: unknown scheme {scheme!r} (served here: "
                         f"{', '.join(sorted(SCHEMES))})")
    module, _, name = path.rpartition(".")
    cls: type[MessageQueueTrigger] = getattr(importlib.import_module(module), name)
    return cls


def resolve_spellings(
    *, queue: str | None, scheme: str | None, trigger_queue: str | None,
) -> tuple[str, str | None, str | None]:
    """``(scheme, broker URI, trigger queue)`` from either common-messaging spelling.

    With ``scheme``, ``queue`` is the trigger queue (3.4); without, the
    broker URI (2.1), whose scheme it gives. ``ValueError`` (one line) when
    neither is given, when ``queue`` and ``trigger_queue`` name different
    trigger queues, or when ``scheme`` is given with a URI as ``queue``.
    """
    if scheme is None:
        if queue is None:
            raise ValueError("MessageQueueTrigger: give scheme= (and the broker's arguments)")
        if "://" not in queue:
            raise ValueError(f"MessageQueueTrigger: queue={queue!r} without scheme=: since "
                             "Airflow 3.4 queue= is the trigger queue; give scheme= too")
        return _scheme_of_uri(queue), queue, trigger_queue
    if queue is not None and "://" in queue:
        raise ValueError(f"MessageQueueTrigger: with scheme=, queue= is the trigger queue "
                         f"(Airflow 3.4), not a broker URI ({queue!r}); pass the broker's "
                         "arguments (topics=, sqs_queue=, ...) instead")
    if queue is not None and trigger_queue is not None and queue != trigger_queue:
        raise ValueError(f"MessageQueueTrigger: queue={queue!r} and trigger_queue="
                         f"{trigger_queue!r} both name the trigger queue; give one")
    return scheme, None, queue if queue is not None else trigger_queue


class MessageQueueTrigger(BaseEventTrigger):
    """Watch a broker named by ``scheme``; builds that scheme's shared-stream trigger.

    ``MessageQueueTrigger(scheme=..., **broker_arguments)`` returns an
    instance of the scheme's subclass (see the module docstring for the
    schemes and the two spellings of ``queue``), which checks the broker
    arguments where the trigger is declared: an argument the broker's
    Airflow trigger does not take is a ``TypeError``, one that cannot work
    here a ``ValueError``, each one line naming it.

    A subclass sets :attr:`scheme` and implements :meth:`broker_arguments`;
    the rest (``shared_stream_key``, the producer, the filter) is the
    broker's own.
    """

    scheme: ClassVar[str]
    """The scheme this class serves (set by each subclass)."""

    def __new__(cls, *, queue: str | None = None, scheme: str | None = None,
                trigger_queue: str | None = None, **kwargs: Any) -> MessageQueueTrigger:
        """An instance of the scheme's class (of ``cls`` itself when it is a subclass)."""
        target = cls
        if cls is MessageQueueTrigger:
            chosen, _, _ = resolve_spellings(queue=queue, scheme=scheme,
                                             trigger_queue=trigger_queue)
            target = _backing_class(chosen)
        return super().__new__(target)

    def __init__(self, *, queue: str | None = None, scheme: str | None = None,
                 trigger_queue: str | None = None, **kwargs: Any) -> None:
        super().__init__()
        chosen, uri, self.queue = resolve_spellings(queue=queue, scheme=scheme,
                                                    trigger_queue=trigger_queue)
        if chosen != self.scheme:
            raise ValueError(f"{type(self).__qualname__} serves scheme {self.scheme!r}, "
                             f"not {chosen!r}")
        self.kwargs: dict[str, Any] = self.broker_arguments(uri, kwargs)

    def broker_arguments(self, uri: str | None, kwargs: Mapping[str, Any]) -> dict[str, Any]:
        """The broker's arguments, checked, with their defaults; ``uri`` is 2.1's broker URI.

        Called once by ``__init__``; raises ``TypeError`` for an argument the
        broker's Airflow trigger does not take and ``ValueError`` for one
        that cannot work here. The result is what :meth:`serialize` stores.
        """
        raise NotImplementedError

    async def run(self) -> AsyncIterator[TriggerEvent]:
        """Not used: these triggers run on their shared stream only."""
        raise NotImplementedError(f"{type(self).__qualname__} runs on the shared stream only")
        yield  # type: ignore[unreachable]

    def serialize(self) -> tuple[str, dict[str, Any]]:
        """``(classpath, kwargs)``: ``scheme``, the broker's arguments, ``queue`` when set.

        The classpath names the class (a user's subclass included); the
        kwargs rebuild it under Airflow 3.4's spelling.
        """
        kwargs: dict[str, Any] = {"scheme": self.scheme, **self.kwargs}
        if self.queue is not None:
            kwargs["queue"] = self.queue
        return f"{type(self).__module__}.{type(self).__qualname__}", kwargs


def check_arguments(owner: str, given: Mapping[str, Any], defaults: Mapping[str, Any],
                    required: tuple[str, ...] = ()) -> dict[str, Any]:
    """``given`` over ``defaults``: ``TypeError`` for a name not in ``defaults`` or a missing one.

    ``owner`` names the Airflow trigger whose arguments these are, in the message.
    """
    unknown = sorted(set(given) - set(defaults))
    if unknown:
        raise TypeError(f"MessageQueueTrigger: {owner} takes no argument "
                        f"{', '.join(unknown)}")
    merged = {**defaults, **given}
    missing = [name for name in required if merged.get(name) is None]
    if missing:
        raise TypeError(f"MessageQueueTrigger: {owner} needs {', '.join(missing)}")
    return merged
