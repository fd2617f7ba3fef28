"""Definitions for the per-record backoff test: a watcher whose filter raises on bad records.

``picky`` raises on every record whose JSON has ``"bad": true`` (a bug in a
user's filter, say); ``every`` fires for every record. Both share one
consumer of ``BAD_TOPIC`` on ``BAD_BOOTSTRAP`` (group ``BAD_GROUP``), with
dead letters to ``BAD_DLQ`` after two tolerated failures.
"""

from __future__ import annotations

import os
from typing import Any

from sharedstream.definitions import Asset, AssetWatcher
from sharedstream.triggers.kafka import KafkaSharedStreamTrigger


class Picky(KafkaSharedStreamTrigger):
    """Fires for good records; raises on a bad one (the filter fails, not the record)."""

    def matches(self, value: Any, message: Any) -> bool:
        if value.get("bad"):
            raise ValueError(f"cannot handle record {value['id']}")
        return bool(super().matches(value, message))


STREAM: dict[str, Any] = {
    "bootstrap_servers": os.environ["BAD_BOOTSTRAP"], "topics": [os.environ["BAD_TOPIC"]],
    "group_id": os.environ["BAD_GROUP"], "dead_letter_topic": os.environ["BAD_DLQ"],
    "max_redeliveries": 2, "payload_format": "json",
    "consumer_overrides": {"session_timeout_ms": 2000, "heartbeat_interval_ms": 400}}

picky = Asset("picky", watchers=[AssetWatcher("good", trigger=Picky(**STREAM))])
every = Asset("every", watchers=[AssetWatcher("all", trigger=KafkaSharedStreamTrigger(**STREAM))])
