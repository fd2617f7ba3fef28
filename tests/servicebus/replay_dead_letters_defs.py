"""Definitions for ``test_replay_dead_letters``: two watchers of one Service Bus queue.

``orders/all`` and ``audit/all`` share one receiver (same settings). Each
fires one event per message, holding the message's ``id``, its ``city``
application property and its sequence number, and rejects the messages
whose ``id`` its environment variable lists (``ORDERS_REJECT``,
``AUDIT_REJECT``: comma-separated ids; empty: none); a rejected message goes
to the queue's dead-letter sub-queue. A DAG runs on each asset, one run per
event.

Configured by environment: ``DLR_CONNECTION_STRING``, ``DLR_QUEUE``,
``ORDERS_REJECT``, ``AUDIT_REJECT``.
"""

from __future__ import annotations

import os
from typing import Any

from sharedstream.triggers.servicebus import ServiceBusSharedStreamTrigger
from tests.dead_letter_replay_kit import PickyFilter, watched

COMMON: dict[str, Any] = {
    "connection_string": os.environ["DLR_CONNECTION_STRING"],
    "queue": os.environ["DLR_QUEUE"],
    "lock_duration": 5,
    "max_wait_time": 1.0,
}


class Picky(PickyFilter, ServiceBusSharedStreamTrigger):
    """The stock trigger with the filter of :class:`tests.dead_letter_replay_kit.PickyFilter`."""

    def described(self, message: Any) -> dict[str, Any]:
        return {"city": message.properties.get("city"),
                "sequence_number": message.sequence_number}


class OrdersWatcher(Picky):
    REJECT = "ORDERS_REJECT"


class AuditWatcher(Picky):
    REJECT = "AUDIT_REJECT"


orders, on_orders, audit, on_audit = watched(OrdersWatcher(**COMMON), AuditWatcher(**COMMON))
