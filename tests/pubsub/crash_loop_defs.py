"""Definitions for the Pub/Sub crash-loop test: one slow watcher that raises on a poison message.

``all`` takes ``PUBSUB_TEST_PACE`` seconds over each message (so a killed
triggerer holds many) and raises on a message whose JSON says
``"poison": true`` (a bug in a user's filter). The subscription and its
dead-letter topic come from the environment as for ``pubsub_defs.py``
(``PUBSUB_TEST_PROJECT``, ``PUBSUB_TEST_SUBSCRIPTION``, ``PUBSUB_TEST_DLQ``),
the server from ``PUBSUB_EMULATOR_HOST``; a failure is never tolerated
(``max_redeliveries`` 0), so every delivery a crash caused looks, to the
broker's ``delivery_attempt`` alone, like one too many.
"""

from __future__ import annotations

import os

from sharedstream.definitions import Asset, AssetWatcher
from sharedstream.triggers.pubsub import PubSubSharedStreamTrigger
from tests.paced_poison import PacedPoison

PACE = float(os.environ.get("PUBSUB_TEST_PACE", "0.1"))
MAX_REDELIVERIES = int(os.environ.get("PUBSUB_TEST_MAX_REDELIVERIES", "0"))
MAX_IN_FLIGHT = int(os.environ.get("PUBSUB_TEST_MAX_IN_FLIGHT", "10"))


class Slow(PacedPoison, PubSubSharedStreamTrigger):
    """Fires for every message, ``PACE`` seconds after it came; raises on a poison one."""

    pace = PACE


every = Asset("every", watchers=[AssetWatcher("all", trigger=Slow(
    project=os.environ.get("PUBSUB_TEST_PROJECT", "sharedstream-test"),
    subscription=os.environ.get("PUBSUB_TEST_SUBSCRIPTION", "orders"),
    dead_letter_topic=os.environ.get("PUBSUB_TEST_DLQ") or None,
    ack_deadline=10,  # Pub/Sub's shortest: a killed triggerer's leases lapse within 10 s
    max_in_flight=MAX_IN_FLIGHT, max_redeliveries=MAX_REDELIVERIES,
    payload_format="json",
))])
