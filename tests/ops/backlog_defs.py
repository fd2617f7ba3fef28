"""Definitions of the broker-backlog test: one holdable watcher of a Kafka topic.

The bootstrap address and topic come from ``OPS_KAFKA_BOOTSTRAP`` and
``OPS_KAFKA_TOPIC`` (set by the test before loading this file); ``HELD``
(:mod:`tests.ops.held`) holds the watcher's filter, so nothing is committed
while it is closed.
"""

from __future__ import annotations

import os

from sharedstream.definitions import Asset, AssetWatcher, Dag
from sharedstream.triggers.kafka import KafkaSharedStreamTrigger
from tests.ops.held import HeldFilter


class HeldKafkaTrigger(HeldFilter, KafkaSharedStreamTrigger):
    """The Kafka trigger, waiting for ``HELD`` before each event it yields."""


orders = Asset("orders", watchers=[AssetWatcher("held", trigger=HeldKafkaTrigger(
    bootstrap_servers=os.environ["OPS_KAFKA_BOOTSTRAP"], topics=[os.environ["OPS_KAFKA_TOPIC"]],
    group_id="ops-backlog"))])
ship = Dag("ship", schedule=orders)
