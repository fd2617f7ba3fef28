"""Definitions for ``tests/sqs/test_no_loss``: two watchers of one SQS queue, one receiver.

Both are SQS triggers with the same consumer settings (``payload_format="json"``,
the test's quick receive settings, the same dead-letter queue), so they
share one receiver and every message goes to both; neither has a ``match``,
so each fires one event per message that decodes. ``plain`` is the stock
:class:`SqsSharedStreamTrigger`; ``custom`` is :class:`ChaosWatcher`, the
stock trigger with :class:`tests.no_loss_kit.ChaosMixin`: it can be made
slow (``delay`` seconds per message) or poisoned (it raises on the message
whose JSON ``id`` is ``raise_on_id``), and otherwise behaves like the stock
trigger.

Configured by environment: ``NOLOSS_ENDPOINT`` (moto's URL), ``NOLOSS_QUEUE``
(a queue URL), ``NOLOSS_DLQ`` (a queue URL; empty or unset: no
dead-letter queue), ``NOLOSS_DELAY`` (seconds, default 0),
``NOLOSS_RAISE_ON_ID`` (an integer, default none), ``NOLOSS_MAX_REDELIVERIES``
and ``NOLOSS_MAX_IN_FLIGHT`` (defaults 5 and 500, the trigger's own).
"""

from __future__ import annotations

import os
from typing import Any

from sharedstream.triggers.sqs import SqsSharedStreamTrigger
from tests.no_loss_kit import ChaosMixin, chaos_assets

COMMON: dict[str, Any] = {
    "queue": os.environ["NOLOSS_QUEUE"],
    "endpoint_url": os.environ["NOLOSS_ENDPOINT"],
    "region_name": "us-east-1",
    "credentials": {"aws_access_key_id": "test", "aws_secret_access_key": "test"},
    "dead_letter_queue": os.environ.get("NOLOSS_DLQ") or None,
    "payload_format": "json",
    "max_redeliveries": int(os.environ.get("NOLOSS_MAX_REDELIVERIES", "5")),
    "max_in_flight": int(os.environ.get("NOLOSS_MAX_IN_FLIGHT", "500")),
    # tests.sqs.conftest.FAST (not imported: that module needs pytest): short long-polls,
    # a short visibility, and one receive at a time (moto can hand one message to two
    # concurrent receives, which the exact dead-letter accounting would see as a duplicate).
    "wait_time_seconds": 1,
    "visibility_timeout": 5,
    "receive_concurrency": 1,
}


class ChaosWatcher(ChaosMixin, SqsSharedStreamTrigger):
    """The stock SQS trigger, made slow (``delay``) or poisoned (``raise_on_id``)."""


plain, custom = chaos_assets(SqsSharedStreamTrigger, ChaosWatcher, COMMON)
