"""Definitions for the SQS connection end-to-end test: two watchers on ``conn_id="aws_e2e"``.

The test puts the connection in ``AIRFLOW_CONN_AWS_E2E`` (URI form: keys as
login and password, region and endpoint in the query); the queue comes from
``CONN_TEST_QUEUE``. Nothing about credentials or the endpoint is here.
"""

from __future__ import annotations

import os
from typing import Any

from sharedstream.definitions import Asset, AssetWatcher
from sharedstream.triggers.sqs import SqsSharedStreamTrigger

COMMON: dict[str, Any] = {
    "queue": os.environ.get("CONN_TEST_QUEUE", "orders"), "conn_id": "aws_e2e",
    "wait_time_seconds": 1, "visibility_timeout": 6, "payload_format": "json",
}

orders = Asset("orders", watchers=[AssetWatcher("all", trigger=SqsSharedStreamTrigger(
    **COMMON, match={"json": {"kind": "order"}}))])
refunds = Asset("refunds", watchers=[AssetWatcher("all", trigger=SqsSharedStreamTrigger(
    **COMMON, match={"json": {"kind": "refund"}}))])
