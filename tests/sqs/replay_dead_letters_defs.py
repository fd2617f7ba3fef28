"""Definitions for ``test_replay_dead_letters``: two watchers of one SQS queue, one receiver.

``orders/all`` and ``audit/all`` share one receiver (same settings, no
``dead_letter_queue``: what a watcher rejects is kept in the store's
``dead_letters`` table). Each fires one event per message, holding the
message's ``id``, its ``city`` attribute and its message id, and rejects the
messages whose ``id`` its environment variable lists (``ORDERS_REJECT``,
``AUDIT_REJECT``: comma-separated ids; empty: none) - the bug a replay of its
dead letters makes up for once fixed. A DAG runs on each asset, one run per
event.

Configured by environment: ``DLR_ENDPOINT`` (moto's URL), ``DLR_QUEUE`` (a
queue URL), ``ORDERS_REJECT``, ``AUDIT_REJECT``.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from typing import Any, ClassVar

from sharedstream import TriggerEvent, reject_shared_stream_event
from sharedstream.definitions import Asset, AssetWatcher, Dag
from sharedstream.triggers.sqs import SqsSharedStreamTrigger

COMMON: dict[str, Any] = {
    "queue": os.environ["DLR_QUEUE"],
    "endpoint_url": os.environ["DLR_ENDPOINT"],
    "region_name": "us-east-1",
    "credentials": {"aws_access_key_id": "test", "aws_secret_access_key": "test"},
    "wait_time_seconds": 1,
    "visibility_timeout": 5,
    "receive_concurrency": 1,
}


class Picky(SqsSharedStreamTrigger):
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
            yield TriggerEvent({"id": value["id"], "city": message.attributes.get("city"),
                                "message_id": message.message_id})


class OrdersWatcher(Picky):
    REJECT = "ORDERS_REJECT"


class AuditWatcher(Picky):
    REJECT = "AUDIT_REJECT"


orders = Asset("orders", watchers=[AssetWatcher("all", trigger=OrdersWatcher(**COMMON))])
on_orders = Dag("on_orders", schedule=orders)
audit = Asset("audit", watchers=[AssetWatcher("all", trigger=AuditWatcher(**COMMON))])
on_audit = Dag("on_audit", schedule=audit)
