"""Definitions of the broker-outage readiness test: one watcher of a Kafka topic.

The bootstrap address and topic come from ``OPS_KAFKA_BOOTSTRAP`` and
``OPS_KAFKA_TOPIC`` (set by the test before loading this file).
"""

from __future__ import annotations

import os

from sharedstream.definitions import Asset, AssetWatcher, Dag
from sharedstream.triggers.kafka import KafkaSharedStreamTrigger

orders = Asset("orders", watchers=[AssetWatcher("all", trigger=KafkaSharedStreamTrigger(
    bootstrap_servers=os.environ["OPS_KAFKA_BOOTSTRAP"], topics=[os.environ["OPS_KAFKA_TOPIC"]],
    group_id="ops-readiness"))])
ship = Dag("ship", schedule=orders)
