"""The SQLite store's schema: its migrations, in order.

A migration is a tuple of statements run in one transaction by
:meth:`sharedstream.store.sqlite.SqliteStore.migrate`. Append only; never
edit a released migration (stores in the field have already run it).
"""

from __future__ import annotations

__all__ = ["MIGRATIONS"]

_V1 = (
    """CREATE TABLE store_meta (
        key TEXT PRIMARY KEY,
        value INTEGER NOT NULL
    ) WITHOUT ROWID""",
    "INSERT INTO store_meta (key, value) VALUES ('definitions_generation', 0)",
    """CREATE TABLE triggers (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        fingerprint TEXT NOT NULL UNIQUE,
        classpath TEXT NOT NULL,
        kwargs_blob BLOB NOT NULL,
        state TEXT NOT NULL DEFAULT 'active'
            CHECK (state IN ('active', 'finished', 'failed', 'orphaned')),
        error_count INTEGER NOT NULL DEFAULT 0,
        last_error TEXT,
        last_traceback TEXT,
        last_error_at TEXT,
        created_at TEXT NOT NULL,
        events_stored INTEGER NOT NULL DEFAULT 0
    )""",
    "CREATE INDEX triggers_state ON triggers (state, id)",
    """CREATE TABLE assets (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        name TEXT NOT NULL UNIQUE,
        created_at TEXT NOT NULL
    )""",
    """CREATE TABLE watchers (
        asset_id INTEGER NOT NULL REFERENCES assets (id),
        name TEXT NOT NULL,
        trigger_id INTEGER NOT NULL REFERENCES triggers (id),
        PRIMARY KEY (asset_id, name)
    ) WITHOUT ROWID""",
    "CREATE INDEX watchers_trigger ON watchers (trigger_id)",
    """CREATE TABLE dags (
        dag_id TEXT PRIMARY KEY,
        schedule TEXT NOT NULL,
        updated_at TEXT NOT NULL
    ) WITHOUT ROWID""",
    """CREATE TABLE dag_schedule_assets (
        dag_id TEXT NOT NULL REFERENCES dags (dag_id) ON DELETE CASCADE,
        asset_id INTEGER NOT NULL REFERENCES assets (id),
        PRIMARY KEY (dag_id, asset_id)
    ) WITHOUT ROWID""",
    "CREATE INDEX dag_schedule_assets_asset ON dag_schedule_assets (asset_id)",
    """CREATE TABLE trigger_events (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        trigger_id INTEGER NOT NULL REFERENCES triggers (id),
        idem_key TEXT UNIQUE,
        payload BLOB NOT NULL,
        created_at TEXT NOT NULL
    )""",
    "CREATE INDEX trigger_events_trigger ON trigger_events (trigger_id, id)",
    """CREATE TABLE asset_events (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        asset_id INTEGER NOT NULL REFERENCES assets (id),
        trigger_event_id INTEGER NOT NULL REFERENCES trigger_events (id),
        created_at TEXT NOT NULL
    )""",
    "CREATE INDEX asset_events_trigger_event ON asset_events (trigger_event_id)",
    "CREATE INDEX asset_events_asset ON asset_events (asset_id, id)",
    """CREATE TABLE asset_dag_queue (
        dag_id TEXT NOT NULL REFERENCES dags (dag_id) ON DELETE CASCADE,
        asset_event_id INTEGER NOT NULL REFERENCES asset_events (id),
        asset_id INTEGER NOT NULL REFERENCES assets (id),
        PRIMARY KEY (dag_id, asset_event_id)
    ) WITHOUT ROWID""",
    "CREATE INDEX asset_dag_queue_event ON asset_dag_queue (asset_event_id)",
    """CREATE TABLE dag_runs (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        dag_id TEXT NOT NULL,
        run_id TEXT NOT NULL,
        state TEXT NOT NULL,
        created_at TEXT NOT NULL,
        UNIQUE (dag_id, run_id)
    )""",
    "CREATE INDEX dag_runs_dag ON dag_runs (dag_id, id)",
    """CREATE TABLE dag_run_asset_events (
        dag_run_id INTEGER NOT NULL REFERENCES dag_runs (id),
        asset_event_id INTEGER NOT NULL REFERENCES asset_events (id),
        PRIMARY KEY (dag_run_id, asset_event_id)
    ) WITHOUT ROWID""",
    "CREATE INDEX dag_run_asset_events_event ON dag_run_asset_events (asset_event_id)",
    """CREATE TABLE triggerers (
        id TEXT PRIMARY KEY,
        hostname TEXT NOT NULL,
        pid INTEGER NOT NULL,
        started_at TEXT NOT NULL,
        heartbeat_at TEXT NOT NULL
    ) WITHOUT ROWID""",
)

# Dead letters (see sharedstream.store._rows for the column formats).
_V2 = (
    """CREATE TABLE dead_letters (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        created_at TEXT NOT NULL,
        stream TEXT NOT NULL,
        source TEXT NOT NULL,
        reason TEXT NOT NULL,
        triggers TEXT NOT NULL,
        payload BLOB NOT NULL,
        payload_size INTEGER NOT NULL CHECK (payload_size >= length(payload)),
        headers TEXT NOT NULL,
        UNIQUE (stream, source, reason)
    )""",
    "CREATE INDEX dead_letters_stream ON dead_letters (stream, id)",
)

# Several triggerers: who runs a standalone trigger (its owner's heartbeat is the
# lease), and what each triggerer runs (a JSON list of trigger ids).
_V3 = (
    "ALTER TABLE triggers ADD COLUMN triggerer_id TEXT",
    "CREATE INDEX triggers_triggerer ON triggers (triggerer_id)",
    "ALTER TABLE triggerers ADD COLUMN running TEXT NOT NULL DEFAULT '[]'",
)

# Time-based scheduling: each DAG's serialized timetable, its bounds and the
# schedule loop's bookkeeping (see sharedstream.store._dag_schedules); runs
# carry their type, logical date and data interval. An asset-triggered run
# leaves them NULL (its run_after is its created_at).
_V4 = (
    "ALTER TABLE dags ADD COLUMN timetable TEXT",
    "ALTER TABLE dags ADD COLUMN timetable_summary TEXT",
    "ALTER TABLE dags ADD COLUMN start_date TEXT",
    "ALTER TABLE dags ADD COLUMN end_date TEXT",
    "ALTER TABLE dags ADD COLUMN catchup INTEGER NOT NULL DEFAULT 0",
    "ALTER TABLE dags ADD COLUMN last_interval_start TEXT",
    "ALTER TABLE dags ADD COLUMN last_interval_end TEXT",
    "ALTER TABLE dags ADD COLUMN next_logical_date TEXT",
    "ALTER TABLE dags ADD COLUMN next_interval_start TEXT",
    "ALTER TABLE dags ADD COLUMN next_interval_end TEXT",
    "ALTER TABLE dags ADD COLUMN next_run_after TEXT",
    "ALTER TABLE dags ADD COLUMN next_run_id TEXT",
    "ALTER TABLE dags ADD COLUMN revision INTEGER NOT NULL DEFAULT 0",
    "ALTER TABLE dag_runs ADD COLUMN run_type TEXT NOT NULL DEFAULT 'asset_triggered'"
    " CHECK (run_type IN ('asset_triggered', 'scheduled', 'manual'))",
    "ALTER TABLE dag_runs ADD COLUMN logical_date TEXT",
    "ALTER TABLE dag_runs ADD COLUMN data_interval_start TEXT",
    "ALTER TABLE dag_runs ADD COLUMN data_interval_end TEXT",
    "ALTER TABLE dag_runs ADD COLUMN run_after TEXT",
)

# Trace context: the W3C traceparent of the span that processed a stored event,
# and of the event that completed an asset-triggered run's condition (NULL when
# there was none, and for every row written before this version).
_V5 = (
    "ALTER TABLE trigger_events ADD COLUMN trace_parent TEXT",
    "ALTER TABLE dag_runs ADD COLUMN trace_parent TEXT",
)

# Dispatch (sharedstream.store.outbox): a queued run is the outbox's message. Its
# state moves on as a dispatcher claims it (claimed_by: a triggerer id, whose
# heartbeat is the claim's lease), delivers it and follows it at its target; each
# delivery is an attempt row. A DAG can be paused (its runs wait) and names its
# target (JSON); a manual run keeps its conf (JSON). attempt_base: the attempts made
# before the last `runs retry` (its new retry budget counts from there). batching (JSON,
# NULL: none) makes a DAG's asset-triggered runs batches (sharedstream.store._batches).
# A dead letter re-driven to its source says when, and how many times.
_V6 = (
    "ALTER TABLE dag_runs ADD COLUMN conf TEXT",
    "ALTER TABLE dag_runs ADD COLUMN target TEXT",
    "ALTER TABLE dag_runs ADD COLUMN attempts INTEGER NOT NULL DEFAULT 0",
    "ALTER TABLE dag_runs ADD COLUMN attempt_base INTEGER NOT NULL DEFAULT 0",
    "ALTER TABLE dag_runs ADD COLUMN next_attempt_at TEXT",
    "ALTER TABLE dag_runs ADD COLUMN claimed_by TEXT",
    "ALTER TABLE dag_runs ADD COLUMN last_error TEXT",
    "ALTER TABLE dag_runs ADD COLUMN external_id TEXT",
    "ALTER TABLE dag_runs ADD COLUMN external_url TEXT",
    "ALTER TABLE dag_runs ADD COLUMN dispatched_at TEXT",
    "ALTER TABLE dag_runs ADD COLUMN ended_at TEXT",
    "ALTER TABLE dag_runs ADD COLUMN updated_at TEXT",
    "CREATE INDEX dag_runs_state ON dag_runs (state, id)",
    """CREATE TABLE dag_run_attempts (
        dag_run_id INTEGER NOT NULL REFERENCES dag_runs (id) ON DELETE CASCADE,
        attempt INTEGER NOT NULL,
        triggerer_id TEXT,
        target TEXT,
        started_at TEXT NOT NULL,
        ended_at TEXT,
        outcome TEXT,
        detail TEXT,
        output TEXT,
        PRIMARY KEY (dag_run_id, attempt)
    ) WITHOUT ROWID""",
    "ALTER TABLE dags ADD COLUMN paused INTEGER NOT NULL DEFAULT 0",
    "ALTER TABLE dags ADD COLUMN target TEXT",
    "ALTER TABLE dags ADD COLUMN batching TEXT",
    "ALTER TABLE dead_letters ADD COLUMN redriven_at TEXT",
    "ALTER TABLE dead_letters ADD COLUMN redrives INTEGER NOT NULL DEFAULT 0",
)

# Failures of raw events that count against them (a watcher failed on the message itself),
# by the raw event's name: whether a message the broker delivered too often is poison is
# decided by this durable count, not by the broker's (a crash's redeliveries are not
# failures). Rows not updated for a while are pruned.
_V7 = (
    """CREATE TABLE raw_event_failures (
        name TEXT PRIMARY KEY,
        failures INTEGER NOT NULL CHECK (failures > 0),
        updated_at TEXT NOT NULL
    )""",
    "CREATE INDEX raw_event_failures_updated ON raw_event_failures (updated_at)",
)

# A stored trigger event keeps the fingerprint of the broker message it came from
# (NULL: none given, or stored before this version), which tells a redelivery from a
# new message that reused the name in its idempotency key (a recreated topic's offsets).
_V8 = ("ALTER TABLE trigger_events ADD COLUMN fingerprint TEXT",)

# A trigger's queue (Airflow 3.4's trigger queues; NULL: none): a triggerer runs the
# triggers of the queues it is configured for ([triggerer] queues), or those with none.
_V9 = ("ALTER TABLE triggers ADD COLUMN queue TEXT",)

# Replays (sharedstream.store.replays): one watcher's catch-up on its stream, asked for
# by a person and run by a triggerer that claims it; the row is its durable progress.
# At most one active replay per trigger (the partial unique index).
_V10 = (
    """CREATE TABLE replays (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        trigger_id INTEGER NOT NULL REFERENCES triggers (id),
        watcher TEXT NOT NULL,
        state TEXT NOT NULL CHECK (state IN ('pending', 'running', 'cancelling', 'done',
                                             'cancelled', 'failed')),
        request TEXT NOT NULL,
        plan TEXT,
        positions TEXT NOT NULL,
        total BIGINT,
        done BIGINT NOT NULL DEFAULT 0,
        matched BIGINT NOT NULL DEFAULT 0,
        stored BIGINT NOT NULL DEFAULT 0,
        rejected BIGINT NOT NULL DEFAULT 0,
        triggerer_id TEXT,
        error TEXT,
        created_at TEXT NOT NULL,
        updated_at TEXT NOT NULL,
        finished_at TEXT
    )""",
    "CREATE UNIQUE INDEX replays_one_active ON replays (trigger_id)"
    " WHERE state IN ('pending', 'running', 'cancelling')",
)

MIGRATIONS: tuple[tuple[str, ...], ...] = (_V1, _V2, _V3, _V4, _V5, _V6, _V7, _V8, _V9, _V10)
"""Migration ``n`` (1-based) is ``MIGRATIONS[n - 1]``: statements run in one transaction.

Append only; never edit a released migration.
"""
