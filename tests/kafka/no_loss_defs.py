"""Definitions for ``test_no_loss``: two watchers of one topic through one shared consumer.

Both are Kafka triggers with the same settings (``payload_format="json"``, a
dead-letter topic), so they share one consumer and every record goes to
both; neither has a ``match``, so each fires one event per record that
decodes. ``plain`` is the stock :class:`KafkaSharedStreamTrigger`;
``custom`` is :class:`ChaosWatcher`, the stock trigger with
:class:`tests.no_loss_kit.ChaosMixin`: it can be made slow (``delay``
seconds per record) or poisoned (it raises on the record whose ``id`` is
``raise_on_id``), and otherwise behaves like the stock trigger.

Configured by environment: ``NOLOSS_BOOTSTRAP``, ``NOLOSS_TOPIC``,
``NOLOSS_GROUP``, ``NOLOSS_DELAY`` (seconds, default 0) and
``NOLOSS_RAISE_ON_ID`` (an integer, default none).
"""

from __future__ import annotations

import os
from typing import Any

from sharedstream.triggers.kafka import KafkaSharedStreamTrigger
from tests.no_loss_kit import ChaosMixin, chaos_assets

_TOPIC = os.environ["NOLOSS_TOPIC"]
COMMON: dict[str, Any] = {
    "bootstrap_servers": os.environ["NOLOSS_BOOTSTRAP"],
    "topics": [_TOPIC],
    "group_id": os.environ["NOLOSS_GROUP"],
    "dead_letter_topic": f"{_TOPIC}.dlq",
    "payload_format": "json",
    "consumer_overrides": {"session_timeout_ms": 2000, "heartbeat_interval_ms": 400},
}


class ChaosWatcher(ChaosMixin, KafkaSharedStreamTrigger):
    """The stock Kafka trigger, made slow (``delay``) or poisoned (``raise_on_id``)."""


plain, custom = chaos_assets(KafkaSharedStreamTrigger, ChaosWatcher, COMMON)
