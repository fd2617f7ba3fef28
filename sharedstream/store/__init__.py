"""The metadata store: definitions, trigger events, asset events and queued DAG runs.

:class:`MetadataStore` is the contract (module :mod:`sharedstream.store.base`);
:class:`SqliteStore` is the embedded backend.
"""

from sharedstream.store.base import (
    RUN_STATE_QUEUED,
    TRIGGER_STATES,
    DagSpec,
    EventRow,
    MetadataStore,
    PendingEvent,
    RunRow,
    Schedule,
    StoreError,
    StoreWriteError,
    TriggererRow,
    TriggerRow,
    TriggerSpec,
    WatcherSpec,
    WriteResult,
)
from sharedstream.store.sqlite import SqliteStore

__all__ = [
    "RUN_STATE_QUEUED",
    "TRIGGER_STATES",
    "DagSpec",
    "EventRow",
    "MetadataStore",
    "PendingEvent",
    "RunRow",
    "Schedule",
    "SqliteStore",
    "StoreError",
    "StoreWriteError",
    "TriggerRow",
    "TriggerSpec",
    "TriggererRow",
    "WatcherSpec",
    "WriteResult",
]
