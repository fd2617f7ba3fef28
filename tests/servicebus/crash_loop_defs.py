"""Definitions for the crash-loop test: one slow watcher that raises on a poison message.

``all`` takes ``SERVICEBUS_TEST_PACE`` seconds over each message (so a
killed triggerer holds many) and raises on a message whose JSON says
``"poison": true`` (a bug in a user's filter). The queue, the server and
whether it has sessions come from the environment as for
``servicebus_defs.py``; so do ``max_in_flight`` (``SERVICEBUS_TEST_MAX_IN_FLIGHT``, default 10) and
``max_redeliveries``
(``SERVICEBUS_TEST_MAX_REDELIVERIES``, default 0: a failure is never
tolerated, so every delivery a crash caused looks, to the broker's count
alone, like one too many).
"""

from __future__ import annotations

import os

from sharedstream.definitions import Asset, AssetWatcher
from sharedstream.triggers.servicebus import ServiceBusSharedStreamTrigger
from tests.paced_poison import PacedPoison

PACE = float(os.environ.get("SERVICEBUS_TEST_PACE", "0.1"))
MAX_REDELIVERIES = int(os.environ.get("SERVICEBUS_TEST_MAX_REDELIVERIES", "0"))
MAX_IN_FLIGHT = int(os.environ.get("SERVICEBUS_TEST_MAX_IN_FLIGHT", "10"))


class Slow(PacedPoison, ServiceBusSharedStreamTrigger):
    """Fires for every message, ``PACE`` seconds after it came; raises on a poison one."""

    pace = PACE


every = Asset("every", watchers=[AssetWatcher("all", trigger=Slow(
    connection_string=os.environ.get("SERVICEBUS_TEST_CONNECTION_STRING", ""),
    queue=os.environ.get("SERVICEBUS_TEST_QUEUE", "orders"),
    sessions=os.environ.get("SERVICEBUS_TEST_SESSIONS") == "1",
    lock_duration=5, max_wait_time=1.0, max_messages=10, max_in_flight=MAX_IN_FLIGHT,
    max_redeliveries=MAX_REDELIVERIES,
    payload_format="json",
))])
