"""The metadata store: definitions, trigger events, asset events and queued DAG runs.

:class:`MetadataStore` is the contract (module :mod:`sharedstream.store.base`);
:func:`open_store` opens one from its URL: :class:`SqliteStore`, the embedded
backend, or ``sharedstream.store.postgres.PostgresStore`` (imported only
when a ``postgresql://`` URL is opened: it needs the ``postgres`` extra).
"""

from sharedstream.store.base import (
    RUN_STATE_QUEUED,
    RUN_TYPES,
    TRIGGER_STATES,
    Claim,
    DagRow,
    DagSpec,
    DeadLetterRow,
    EventRow,
    MetadataStore,
    PendingEvent,
    QueuedRuns,
    RunRow,
    Schedule,
    SchemaStatus,
    StoreError,
    StoreWriteError,
    TimedRun,
    TriggererRow,
    TriggerRow,
    TriggerSpec,
    WatcherSpec,
    WriteResult,
    redact_url,
)
from sharedstream.store.factory import open_store, serves_one_triggerer, triggerer_guard
from sharedstream.store.outbox import (
    FINISHED_STATES,
    RUN_STATES,
    UNFINISHED_STATES,
    AttemptRow,
    ClaimedRun,
    DispatchResult,
    OutboxStore,
    PruneResult,
    RunEvent,
)
from sharedstream.store.sqlite import SqliteStore

__all__ = [
    "FINISHED_STATES",
    "RUN_STATES",
    "RUN_STATE_QUEUED",
    "RUN_TYPES",
    "TRIGGER_STATES",
    "UNFINISHED_STATES",
    "AttemptRow",
    "Claim",
    "ClaimedRun",
    "DagRow",
    "DagSpec",
    "DeadLetterRow",
    "DispatchResult",
    "EventRow",
    "MetadataStore",
    "OutboxStore",
    "PendingEvent",
    "PruneResult",
    "QueuedRuns",
    "RunEvent",
    "RunRow",
    "Schedule",
    "SchemaStatus",
    "SqliteStore",
    "StoreError",
    "StoreWriteError",
    "TimedRun",
    "TriggerRow",
    "TriggerSpec",
    "TriggererRow",
    "WatcherSpec",
    "WriteResult",
    "open_store",
    "redact_url",
    "serves_one_triggerer",
    "triggerer_guard",
]
