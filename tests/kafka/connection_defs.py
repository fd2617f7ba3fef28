"""Definitions for the Kafka connection end-to-end test: watchers that name a connection.

Two watchers share one consumer through ``conn_id="kafka_e2e"`` (the test
puts that connection in ``AIRFLOW_CONN_KAFKA_E2E``: bootstrap servers, group
and session timeouts); a third names a connection nobody defined and must
fail alone. The topic comes from ``CONN_TEST_TOPIC``.
"""

from __future__ import annotations

import os

from sharedstream.definitions import Asset, AssetWatcher
from sharedstream.triggers.kafka import KafkaSharedStreamTrigger

TOPIC = os.environ.get("CONN_TEST_TOPIC", "orders")

orders = Asset("orders", watchers=[AssetWatcher("all", trigger=KafkaSharedStreamTrigger(
    topics=[TOPIC], conn_id="kafka_e2e", payload_format="json",
    match={"json": {"kind": "order"}},
))])
refunds = Asset("refunds", watchers=[AssetWatcher("all", trigger=KafkaSharedStreamTrigger(
    topics=[TOPIC], conn_id="kafka_e2e", payload_format="json",
    match={"json": {"kind": "refund"}},
))])
lost = Asset("lost", watchers=[AssetWatcher("all", trigger=KafkaSharedStreamTrigger(
    topics=[TOPIC], group_id="lost-group", conn_id="no_such_conn",
))])
