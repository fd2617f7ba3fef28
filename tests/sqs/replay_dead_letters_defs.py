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

import os
from typing import Any

from sharedstream.triggers.sqs import SqsSharedStreamTrigger
from tests.dead_letter_replay_kit import PickyFilter, watched

COMMON: dict[str, Any] = {
    "queue": os.environ["DLR_QUEUE"],
    "endpoint_url": os.environ["DLR_ENDPOINT"],
    "region_name": "us-east-1",
    "credentials": {"aws_access_key_id": "test", "aws_secret_access_key": "test"},
    "wait_time_seconds": 1,
    "visibility_timeout": 5,
    "receive_concurrency": 1,
}


class Picky(PickyFilter, SqsSharedStreamTrigger):
    """The stock trigger with the filter of :class:`tests.dead_letter_replay_kit.PickyFilter`."""

    def described(self, message: Any) -> dict[str, Any]:
        return {"city": message.attributes.get("city"), "message_id": message.message_id}


class OrdersWatcher(Picky):
    REJECT = "ORDERS_REJECT"


class AuditWatcher(Picky):
    REJECT = "AUDIT_REJECT"


orders, on_orders, audit, on_audit = watched(OrdersWatcher(**COMMON), AuditWatcher(**COMMON))
