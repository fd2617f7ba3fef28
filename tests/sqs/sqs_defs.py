"""A definitions file for the SQS end-to-end tests: three watchers on one queue, one DAG.

Where the queue is comes from the environment (``SQS_TEST_ENDPOINT``,
``SQS_TEST_QUEUE``, ``SQS_TEST_DLQ``). Messages are JSON objects
``{"id": n, "kind": "order"|"refund"}`` with a ``region`` attribute; a body
that is not JSON is rejected (dead-lettered) by every watcher.
"""

from __future__ import annotations

import os
from typing import Any

from sharedstream.definitions import Asset, AssetWatcher, Dag
from sharedstream.triggers.sqs import SqsSharedStreamTrigger

COMMON: dict[str, Any] = {
    "queue": os.environ.get("SQS_TEST_QUEUE", "orders"),
    "endpoint_url": os.environ.get("SQS_TEST_ENDPOINT"),
    "dead_letter_queue": os.environ.get("SQS_TEST_DLQ"),
    "credentials": {"aws_access_key_id": "test", "aws_secret_access_key": "test"},
    "wait_time_seconds": 1,
    "visibility_timeout": 6,
    "payload_format": "json",
}

orders = Asset("orders", watchers=[AssetWatcher("all", trigger=SqsSharedStreamTrigger(
    **COMMON, match={"json": {"kind": "order"}},
))])
eu_orders = Asset("eu_orders", watchers=[AssetWatcher("eu", trigger=SqsSharedStreamTrigger(
    **COMMON, match={"json": {"kind": "order"}, "attributes": {"region": "eu"}},
))])
refunds = Asset("refunds", watchers=[AssetWatcher("all", trigger=SqsSharedStreamTrigger(
    **COMMON, match={"json": {"kind": "refund"}},
))])

ship = Dag("ship", schedule=orders)  # one run per order
