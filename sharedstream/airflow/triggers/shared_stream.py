"""Mirror of ``airflow.triggers.shared_stream``: the manager, the producer contract, errors.

``from airflow.triggers.shared_stream import SharedStreamManager`` ports as
``from sharedstream.airflow.triggers.shared_stream import SharedStreamManager``.
The objects are :mod:`sharedstream`'s own; :class:`SubscriberOverflow` is
public here on purpose (see ``docs/airflow.md``).
"""

from sharedstream.engine.errors import AckTimeout, SubscriberOverflow
from sharedstream.engine.manager import (
    DEFAULT_ACK_TIMEOUT,
    DEFAULT_SUBSCRIBER_QUEUE_MAX,
    SharedStreamManager,
)
from sharedstream.engine.producer import AdvanceItem, AdvanceOutcome, SharedStreamProducer
from sharedstream.engine.stream import reject_shared_stream_event

__all__ = [
    "DEFAULT_ACK_TIMEOUT",
    "DEFAULT_SUBSCRIBER_QUEUE_MAX",
    "AckTimeout",
    "AdvanceItem",
    "AdvanceOutcome",
    "SharedStreamManager",
    "SharedStreamProducer",
    "SubscriberOverflow",
    "reject_shared_stream_event",
]
