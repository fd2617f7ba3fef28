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

import json
import os
from collections.abc import AsyncIterator
from typing import Any, ClassVar

from sharedstream import TriggerEvent, reject_shared_stream_event
from sharedstream.definitions import Asset, AssetWatcher, Dag
from sharedstream.triggers.servicebus import ServiceBusSharedStreamTrigger

COMMON: dict[str, Any] = {
    "connection_string": os.environ["DLR_CONNECTION_STRING"],
    "queue": os.environ["DLR_QUEUE"],
    "lock_duration": 5,
    "max_wait_time": 1.0,
}


class Picky(ServiceBusSharedStreamTrigger):
    """Fires for every message but those whose ``id`` the variable :attr:`REJECT` lists."""

    REJECT: ClassVar[str] = ""

    async def filter_shared_stream(self, shared_stream: AsyncIterator[Any]
                                   ) -> AsyncIterator[TriggerEvent]:
        refused = {int(i) for i in os.environ.get(self.REJECT, "").split(",") if i}
        async for message in shared_stream:
            value = json.loads(message.body)
            if value["id"] in refused:
                reject_shared_stream_event(f"{self.REJECT} lists id {value['id']}")
                continue
            yield TriggerEvent({"id": value["id"], "city": message.properties.get("city"),
                                "sequence_number": message.sequence_number})


class OrdersWatcher(Picky):
    REJECT = "ORDERS_REJECT"


class AuditWatcher(Picky):
    REJECT = "AUDIT_REJECT"


orders = Asset("orders", watchers=[AssetWatcher("all", trigger=OrdersWatcher(**COMMON))])
on_orders = Dag("on_orders", schedule=orders)
audit = Asset("audit", watchers=[AssetWatcher("all", trigger=AuditWatcher(**COMMON))])
on_audit = Dag("on_audit", schedule=audit)
