"""Definitions for the SQS crash-loop test: one slow watcher that raises on a poison message.

``all`` takes ``SQS_TEST_PACE`` seconds over each message (so a killed
triggerer holds many) and raises on a message whose JSON says
``"poison": true`` (a bug in a user's filter). The queue and its
dead-letter queue come from the environment as for ``sqs_defs.py``
(``SQS_TEST_ENDPOINT``, ``SQS_TEST_QUEUE``, ``SQS_TEST_DLQ``); a failure is
never tolerated (``max_redeliveries`` 0), so every receive a crash caused
looks, to SQS's ``ApproximateReceiveCount`` alone, like one too many.
"""

from __future__ import annotations

import os

from sharedstream.definitions import Asset, AssetWatcher
from sharedstream.triggers.sqs import SqsSharedStreamTrigger
from tests.paced_poison import PacedPoison

PACE = float(os.environ.get("SQS_TEST_PACE", "0.1"))


class Slow(PacedPoison, SqsSharedStreamTrigger):
    """Fires for every message, ``PACE`` seconds after it came; raises on a poison one."""

    pace = PACE


every = Asset("every", watchers=[AssetWatcher("all", trigger=Slow(
    queue=os.environ.get("SQS_TEST_QUEUE", "orders"),
    endpoint_url=os.environ.get("SQS_TEST_ENDPOINT"),
    dead_letter_queue=os.environ.get("SQS_TEST_DLQ") or None,
    region_name="us-east-1",
    credentials={"aws_access_key_id": "test", "aws_secret_access_key": "test"},
    # Short long-polls, one receive at a time (moto can hand one message to two concurrent
    # receives), and a short visibility: a killed triggerer's messages show again within 3 s.
    wait_time_seconds=1, receive_concurrency=1, visibility_timeout=3,
    max_messages=10, max_in_flight=10, max_redeliveries=0,
    payload_format="json",
))])
