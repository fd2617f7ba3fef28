"""What the end-to-end benchmarks share: the messages, the expected events, the baseline's store.

Every e2e benchmark (``kafka_e2e.py``, ``sqs_e2e.py``, ``pubsub_e2e.py``)
pre-loads the same N JSON messages ``{"id": i, "bucket": i % 10, ...}``;
watcher (or independent consumer) j keeps the messages of bucket ``j % 10``,
so K of them store :func:`expected_events` events. The ``independent K``
baseline - what users run today - stores its 1 in 10 with an
:class:`IndependentStore` each.
"""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

BUCKETS = 10

ACKED: Counter[str] = Counter()
"""Messages acknowledged, by subscription, as reported by a benchmark's generated definitions.

The definitions file is imported by the runtime as its own module; it
reaches the benchmark through this module, which both import once.
"""


def message_body(index: int) -> str:
    """Message ``index`` as JSON; ``bucket`` is what the watchers match on."""
    return json.dumps({"id": index, "bucket": index % BUCKETS, "kind": "order",
                       "amount": (index * 37) % 1000})


def expected_events(messages: int, k: int) -> int:
    """Events K watchers (or consumers) store: watcher j keeps the messages of bucket j % 10."""
    per_bucket = Counter(i % BUCKETS for i in range(messages))
    return sum(per_bucket[j % BUCKETS] for j in range(k))


def cpu_seconds(pid: int | None) -> float | None:
    """User + system CPU seconds a local process has used so far (Linux ``/proc``)."""
    if pid is None:
        return None
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()  # the command name may contain spaces
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class IndependentStore:
    """One consumer's SQLite connection (WAL, synchronous=FULL), one transaction per batch.

    Consumer ``index`` keeps the messages of bucket ``index % 10``. ``loads``
    decodes each body: ``json.loads`` (what users write) by default. Rows are
    keyed by (consumer, source, partition, position), so a redelivered
    message adds nothing. Writes run in a worker thread (``handle``).
    """

    def __init__(self, path: Path, index: int, loads: Callable[[bytes], Any] = json.loads) -> None:
        self.index = index
        self.loads = loads
        self.stored = 0
        self.db = sqlite3.connect(path, timeout=60, check_same_thread=False)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=FULL")
        self.db.execute(
            "CREATE TABLE IF NOT EXISTS events (consumer INTEGER, topic TEXT, partition INTEGER,"
            " offset INTEGER, payload TEXT, PRIMARY KEY (consumer, topic, partition, offset))")
        self.db.commit()

    def write(self, rows: list[tuple[int, str, int, int, str]]) -> None:
        with self.db:
            self.db.executemany("INSERT OR IGNORE INTO events VALUES (?, ?, ?, ?, ?)", rows)
        self.stored += len(rows)

    async def handle(self, messages: Sequence[tuple[str, int, int, bytes]]) -> None:
        """Decode ``(source, partition, position, body)`` messages, store this consumer's share.

        Returns once the batch's transaction is committed: only then may the
        caller acknowledge the batch.
        """
        rows = []
        for source, partition, position, body in messages:
            value = self.loads(body)
            if value.get("bucket") == self.index % BUCKETS:
                rows.append((self.index, source, partition, position, json.dumps(value)))
        if rows:
            await asyncio.to_thread(self.write, rows)
