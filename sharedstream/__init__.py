"""sharedstream: one shared broker consumer per stream, fanned out to many triggers.

Public API (names match Apache Airflow 3.3's trigger API, so trigger code
ports by changing imports only).
"""

from sharedstream.engine.errors import (
    AckTimeout,
    DuplicateSubscription,
    FilterEnded,
    InvalidStreamKey,
    PollTerminated,
    ProducerContractError,
    SharedStreamError,
    StreamStopped,
    SubscriberFailure,
    SubscriberOverflow,
)
from sharedstream.engine.events import TriggerEvent
from sharedstream.engine.manager import (
    DEFAULT_ACK_TIMEOUT,
    DEFAULT_SUBSCRIBER_QUEUE_MAX,
    SharedStreamManager,
)
from sharedstream.engine.producer import AdvanceItem, AdvanceOutcome, SharedStreamProducer
from sharedstream.engine.stream import reject_shared_stream_event
from sharedstream.engine.trigger import BaseEventTrigger, BaseTrigger

__all__ = [
    "DEFAULT_ACK_TIMEOUT",
    "DEFAULT_SUBSCRIBER_QUEUE_MAX",
    "AckTimeout",
    "AdvanceItem",
    "AdvanceOutcome",
    "BaseEventTrigger",
    "BaseTrigger",
    "DuplicateSubscription",
    "FilterEnded",
    "InvalidStreamKey",
    "PollTerminated",
    "ProducerContractError",
    "SharedStreamError",
    "SharedStreamManager",
    "SharedStreamProducer",
    "StreamStopped",
    "SubscriberFailure",
    "SubscriberOverflow",
    "TriggerEvent",
    "reject_shared_stream_event",
]
__version__ = "0.1.0"
