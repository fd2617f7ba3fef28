"""Exact accounting for chaos suites: what each watcher stored, what was dead-lettered.

A chaos case knows, for every input record, which watchers (trigger ids)
must store an event for it and whether it must be dead-lettered, and why.
This module reads what really happened - the ``trigger_events`` of the
SQLite store, dead letters read from the broker by the suite, and the
store's ``dead_letters`` table (the fallback for dead letters the broker
refused) - and compares the two, record by record:

* every expected event is stored exactly once per ``(trigger, source)``
  (none *lost*, none *duplicated*, none *unexpected*);
* every record meant to be dead-lettered is, exactly once over the broker's
  dead-letter destination and the store's table together, in the intended
  place, with the intended reason (and failing triggers, when given); no
  other record is;
* a DAG scheduled on one watcher's asset ran exactly once per record that
  watcher stored (:func:`read_dag_runs`, :func:`compare_runs`).

Broker-neutral: a record's *source* is the name the broker's producer gives
it (``raw_event_name``): ``topic/partition/offset`` for Kafka, the message id
for SQS. The store's idempotency key is ``<trigger id>/<source>#<index>``.

Also here: :class:`PeakRss`, which samples a process's peak resident set
size (``VmHWM``) so a suite can bound the memory a case cost, and the store
faults every broker's suite applies the same way: :class:`StoreLock` (a
``BEGIN EXCLUSIVE`` held by another process) and a full filesystem
(:func:`mount_tmpfs`, :func:`fill_filesystem`, :func:`truncate_wal`).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import re
import shutil
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "IN_BROKER",
    "IN_STORE",
    "DagRun",
    "DeadLetterRecord",
    "Expected",
    "ExpectedDeadLetter",
    "PeakRss",
    "Reality",
    "StoreLock",
    "StoredEvent",
    "assert_exact",
    "compare",
    "compare_runs",
    "count_stored_events",
    "fill_filesystem",
    "mount_tmpfs",
    "parse_idem_key",
    "read_dag_runs",
    "read_dead_letter_table",
    "read_stored_events",
    "trigger_ids",
    "truncate_wal",
    "unmount",
    "watcher_triggers",
]

IN_BROKER = "broker"
"""Where a dead letter went: the broker's dead-letter destination (a DLQ topic or queue)."""
IN_STORE = "store"
"""Where a dead letter went: the store's ``dead_letters`` table (the broker refused it)."""


@dataclass(frozen=True)
class StoredEvent:
    """One ``trigger_events`` row: its trigger, the source record and the event's index."""

    trigger_id: int
    source: str | None  # None: the event has no idempotency key
    index: int


@dataclass(frozen=True)
class DeadLetterRecord:
    """One dead letter, wherever it went (``IN_BROKER`` or ``IN_STORE``)."""

    source: str
    reason: str | None
    where: str
    triggers: frozenset[int] | None = None  # None: not recorded
    detail: str | None = None
    payload_size: int | None = None  # None: not recorded


@dataclass(frozen=True)
class ExpectedDeadLetter:
    """A record that must be dead-lettered once, ``where``, with ``reason``.

    ``triggers`` (when not None) are the ids that must be named as the
    failing ones; ``detail`` (when not None) must occur in the recorded detail;
    ``payload_size`` (when not None) must be the recorded size, if one is recorded.
    """

    reason: str
    where: str = IN_BROKER
    triggers: frozenset[int] | None = None
    detail: str | None = None
    payload_size: int | None = None


@dataclass
class Expected:
    """What a case must end with.

    ``events[trigger_id]`` is the set of sources each of which that trigger
    must have stored exactly one event for (one event per record: index 0).
    """

    events: dict[int, set[str]] = field(default_factory=dict)
    dead_letters: dict[str, ExpectedDeadLetter] = field(default_factory=dict)


@dataclass
class Reality:
    """What a case ended with."""

    events: list[StoredEvent]
    dead_letters: list[DeadLetterRecord]


def parse_idem_key(trigger_id: int, idem_key: str | None) -> StoredEvent:
    """``<trigger id>/<source>#<index>`` -> :class:`StoredEvent` (no key: source ``None``).

    A new message that reused a stored one's name is stored under
    ``<trigger id>/<source>#<index>#<fingerprint>``: the same source and index.
    """
    if idem_key is None:
        return StoredEvent(trigger_id, None, 0)
    prefix, _, rest = idem_key.partition("/")
    source, _, index = rest.rpartition("#")
    if not index.isdigit() and "#" in source:  # renamed: the fingerprint follows the index
        source, _, index = source.rpartition("#")
    if prefix != str(trigger_id) or not source or not index.isdigit():
        raise AssertionError(f"trigger {trigger_id}: unexpected idempotency key {idem_key!r}")
    return StoredEvent(trigger_id, source, int(index))


def _connect(db: Path) -> sqlite3.Connection:
    connection = sqlite3.connect(db, timeout=10)
    connection.row_factory = sqlite3.Row
    return connection


def read_stored_events(db: Path) -> list[StoredEvent]:
    """Every trigger event in the store at ``db``, read directly (a reader never blocks)."""
    with contextlib.closing(_connect(db)) as connection:
        rows = connection.execute("SELECT trigger_id, idem_key FROM trigger_events").fetchall()
    return [parse_idem_key(int(row["trigger_id"]), row["idem_key"]) for row in rows]


def count_stored_events(db: Path) -> int:
    """How many trigger events the store holds (cheap enough to poll)."""
    with contextlib.closing(_connect(db)) as connection:
        return int(connection.execute("SELECT count(*) FROM trigger_events").fetchone()[0])


def trigger_ids(db: Path) -> dict[str, list[int]]:
    """Trigger ids by class path, from the store's ``triggers`` table."""
    ids: dict[str, list[int]] = {}
    with contextlib.closing(_connect(db)) as connection:
        for row in connection.execute("SELECT id, classpath FROM triggers ORDER BY id"):
            ids.setdefault(row["classpath"], []).append(int(row["id"]))
    return ids


def watcher_triggers(db: Path) -> dict[str, int]:
    """Trigger ids by watcher, ``"<asset>/<watcher>"``, from the store's ``watchers`` table.

    For suites whose watchers share one trigger class (and so one class path).
    """
    with contextlib.closing(_connect(db)) as connection:
        rows = connection.execute("SELECT a.name AS asset, w.name AS watcher, w.trigger_id "
                                  "FROM watchers w JOIN assets a ON a.id = w.asset_id")
        return {f"{row['asset']}/{row['watcher']}": int(row["trigger_id"]) for row in rows}


@dataclass(frozen=True)
class DagRun:
    """One queued DAG run and the trigger events (as :class:`StoredEvent`) behind it."""

    dag_id: str
    run_id: str
    events: tuple[StoredEvent, ...]


def read_dag_runs(db: Path, dag_id: str) -> list[DagRun]:
    """Every run of ``dag_id`` in the store, each with the trigger events it consumed."""
    runs: dict[int, tuple[str, list[StoredEvent]]] = {}
    with contextlib.closing(_connect(db)) as connection:
        for row in connection.execute(
            "SELECT r.id, r.run_id, te.trigger_id, te.idem_key FROM dag_runs r "
            "LEFT JOIN dag_run_asset_events ra ON ra.dag_run_id = r.id "
            "LEFT JOIN asset_events ae ON ae.id = ra.asset_event_id "
            "LEFT JOIN trigger_events te ON te.id = ae.trigger_event_id "
            "WHERE r.dag_id = ? ORDER BY r.id", (dag_id,),
        ):
            _, events = runs.setdefault(int(row["id"]), (str(row["run_id"]), []))
            if row["trigger_id"] is not None:
                events.append(parse_idem_key(int(row["trigger_id"]), row["idem_key"]))
    return [DagRun(dag_id, run_id, tuple(events)) for run_id, events in runs.values()]


def compare_runs(dag_id: str, trigger_id: int, sources: set[str],
                 runs: list[DagRun]) -> list[str]:
    """``dag_id`` ran exactly once per source, on that source's event of ``trigger_id`` alone.

    For a DAG scheduled on one asset with one watcher: every run consumes
    one asset event. Every discrepancy, one line each (none: empty).
    """
    problems: list[str] = []
    shapes = [run.run_id for run in runs if len(run.events) != 1
              or run.events[0].trigger_id != trigger_id]
    if shapes:
        problems.append(f"{dag_id}: {len(shapes)} runs not on exactly one event of trigger "
                        f"{trigger_id}: {_sample(shapes)}")
    counts = Counter(run.events[0].source for run in runs if len(run.events) == 1)
    lost = sources - set(counts)
    if lost:
        problems.append(f"{dag_id}: NO run for {len(lost)} of {len(sources)} records: "
                        f"{_sample(lost)}")
    twice = {s: n for s, n in counts.items() if n > 1}
    if twice:
        problems.append(f"{dag_id}: {len(twice)} records ran more than once: "
                        f"{_sample(f'{s} x{n}' for s, n in twice.items())}")
    unexpected = set(counts) - sources
    if unexpected:
        problems.append(f"{dag_id}: {len(unexpected)} runs for records that must not run it: "
                        f"{_sample(map(str, unexpected))}")
    return problems


def _triggers(value: Any) -> frozenset[int] | None:
    if value is None:
        return None
    if isinstance(value, list | tuple):
        return frozenset(int(v) for v in value)
    text = str(value).strip("[] ")
    return frozenset(int(part) for part in text.replace(" ", "").split(",") if part)


def _dead_letter_rows(rows: Iterable[Mapping[str, Any]]) -> list[DeadLetterRecord]:
    # The table has no detail of its own: its reason carries what the triggers said
    # ("max_redeliveries; <why the broker did not take it>: <what they said>").
    return [
        DeadLetterRecord(
            source=str(row["source"]), reason=row.get("reason"), where=IN_STORE,
            triggers=_triggers(row.get("triggers")),
            detail=row.get("detail", row.get("reason")),
            payload_size=None if row.get("payload_size") is None else int(row["payload_size"]),
        )
        for row in rows
    ]


DEAD_LETTER_LIST_LIMIT = 1_000_000
"""Rows asked of ``deadletters list`` (its default, 100, would hide the rest)."""


def read_dead_letter_table(
    config: Path, db: Path, env: Mapping[str, str]
) -> list[DeadLetterRecord]:
    """The store's fallback dead letters, as ``sharedstream deadletters list --json`` lists them.

    Until the command exists, the ``dead_letters`` table is read directly;
    a store without that table has no fallback dead letters (empty list).
    """
    result = subprocess.run(
        [sys.executable, "-m", "sharedstream", "--config", str(config), "deadletters", "list",
         "--json", "--limit", str(DEAD_LETTER_LIST_LIMIT)],
        cwd=config.parent, env=dict(env), capture_output=True, text=True, timeout=60,
        check=False,
    )
    if result.returncode == 0:
        listed = json.loads(result.stdout)
        assert isinstance(listed, list), result.stdout[:500]
        return _dead_letter_rows(listed)
    with contextlib.closing(_connect(db)) as connection:
        exists = connection.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'dead_letters'"
        ).fetchone()
        if not exists:
            return []
        rows = [dict(row) for row in connection.execute("SELECT * FROM dead_letters")]
    return _dead_letter_rows(rows)


def _natural(item: Any) -> tuple[Any, ...]:
    """Sort key: ``t/0/9`` before ``t/0/10``."""
    return tuple(int(part) if part.isdigit() else part for part in re.split(r"(\d+)", str(item)))


def _sample(items: Iterable[Any], limit: int = 8) -> str:
    ordered = sorted(items, key=_natural)
    more = f" (+{len(ordered) - limit} more)" if len(ordered) > limit else ""
    return ", ".join(map(str, ordered[:limit])) + more


def compare(expected: Expected, reality: Reality) -> list[str]:
    """Every discrepancy between ``expected`` and ``reality``, one line each (none: empty)."""
    problems: list[str] = []
    stored = Counter((e.trigger_id, e.source) for e in reality.events)
    unkeyed = Counter(e.trigger_id for e in reality.events if e.source is None)
    for trigger_id, count in sorted(unkeyed.items()):
        problems.append(f"trigger {trigger_id}: {count} events without an idempotency key")
    indexes = [e for e in reality.events if e.source is not None and e.index != 0]
    if indexes:
        problems.append(f"{len(indexes)} events with an index other than 0 (one event per "
                        f"record expected): {_sample(indexes)}")
    triggers = set(expected.events) | {e.trigger_id for e in reality.events}
    for trigger_id in sorted(triggers):
        wanted = expected.events.get(trigger_id, set())
        have = {source for (t, source), _ in stored.items() if t == trigger_id and source}
        lost = wanted - have
        if lost:
            problems.append(f"trigger {trigger_id}: LOST {len(lost)} of {len(wanted)} events "
                            f"(stored {len(have & wanted)}): {_sample(lost)}")
        twice = {s: n for (t, s), n in stored.items() if t == trigger_id and s and n > 1}
        if twice:
            problems.append(f"trigger {trigger_id}: {len(twice)} records stored more than "
                            f"once: {_sample(f'{s} x{n}' for s, n in twice.items())}")
        unexpected = have - wanted
        if unexpected:
            problems.append(f"trigger {trigger_id}: {len(unexpected)} unexpected events "
                            f"(records it must not store): {_sample(unexpected)}")
    problems.extend(_compare_dead_letters(expected.dead_letters, reality.dead_letters))
    return problems


def _same_reason(found: str | None, wanted: str) -> bool:
    """``found`` is ``wanted``, possibly followed by an explanation (``"rejected; ..."``)."""
    return found is not None and re.match(rf"{re.escape(wanted)}\b", found) is not None


def _compare_dead_letters(
    expected: Mapping[str, ExpectedDeadLetter], letters: list[DeadLetterRecord]
) -> list[str]:
    problems: list[str] = []
    by_source: dict[str, list[DeadLetterRecord]] = {}
    for letter in letters:
        by_source.setdefault(letter.source, []).append(letter)
    missing = set(expected) - set(by_source)
    if missing:
        problems.append(f"NOT dead-lettered ({len(missing)} of {len(expected)}): "
                        f"{_sample(f'{s} ({expected[s].reason})' for s in missing)}")
    unintended = set(by_source) - set(expected)
    if unintended:
        problems.append(f"dead-lettered but should not be ({len(unintended)}): " + _sample(
            f"{s} ({by_source[s][0].reason}, {by_source[s][0].where})" for s in unintended))
    for source in sorted(set(expected) & set(by_source)):
        want, found = expected[source], by_source[source]
        if len(found) > 1:
            problems.append(f"{source}: dead-lettered {len(found)} times: "
                            f"{_sample(f'{f.reason} in {f.where}' for f in found)}")
        letter = found[0]
        if letter.where != want.where:
            problems.append(f"{source}: dead-lettered in the {letter.where}, expected in the "
                            f"{want.where}")
        if not _same_reason(letter.reason, want.reason):
            problems.append(f"{source}: dead-letter reason {letter.reason!r:.200}, expected "
                            f"{want.reason!r}")
        if want.triggers is not None and letter.triggers != want.triggers:
            problems.append(f"{source}: dead letter names triggers "
                            f"{sorted(letter.triggers or ())}, expected {sorted(want.triggers)}")
        if want.detail is not None and want.detail not in (letter.detail or ""):
            problems.append(f"{source}: dead-letter detail {letter.detail!r} lacks "
                            f"{want.detail!r}")
        if None not in (want.payload_size, letter.payload_size) and (
                want.payload_size != letter.payload_size):
            problems.append(f"{source}: dead-letter payload_size {letter.payload_size}, "
                            f"expected {want.payload_size}")
    return problems


def assert_exact(expected: Expected, reality: Reality, context: str) -> None:
    """Raise ``AssertionError`` listing every discrepancy, prefixed with ``context``."""
    problems = compare(expected, reality)
    if problems:
        summary = (f"{len(reality.events)} events stored, "
                   f"{sum(len(s) for s in expected.events.values())} expected; "
                   f"{len(reality.dead_letters)} dead letters, "
                   f"{len(expected.dead_letters)} expected")
        raise AssertionError(f"{context}: {summary}\n  " + "\n  ".join(problems))


class PeakRss:
    """The peak resident set size (``VmHWM``, in bytes) of a process, sampled.

    ``VmHWM`` is the kernel's own high-water mark, so sampling only has to
    happen before the process exits; :meth:`watching` samples periodically
    in the background so that a process that dies still left a reading.
    """

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak = 0

    def sample(self) -> int:
        """Read ``VmHWM`` now; returns the peak so far (unchanged if the process is gone)."""
        try:
            status = Path(f"/proc/{self.pid}/status").read_text()
        except (FileNotFoundError, ProcessLookupError):
            return self.peak
        for line in status.splitlines():
            if line.startswith("VmHWM:"):
                self.peak = max(self.peak, int(line.split()[1]) * 1024)
        return self.peak

    @contextlib.asynccontextmanager
    async def watching(self, every: float = 0.25) -> AsyncIterator[PeakRss]:
        """Sample every ``every`` seconds while the block runs, and once at its end."""

        async def sampler() -> None:
            while True:
                self.sample()
                await asyncio.sleep(every)

        task = asyncio.create_task(sampler(), name=f"peak-rss[{self.pid}]")
        try:
            yield self
        finally:
            task.cancel()
            await asyncio.wait([task])  # the sampler's own cancellation; ours still propagates
            self.sample()


# -- store faults ---------------------------------------------------------------------------

_LOCKER = """
import sqlite3, sys
connection = sqlite3.connect(sys.argv[1], timeout=30, isolation_level=None)
connection.execute("BEGIN EXCLUSIVE")
print("locked", flush=True)
sys.stdin.read()  # held until the test closes our stdin
connection.execute("COMMIT")
"""


class StoreLock:
    """Locks a SQLite store from another process (``BEGIN EXCLUSIVE``), as often as asked.

    :meth:`acquire` returns once the lock is held (every write of the store
    then fails with ``database is locked`` after its busy timeout);
    :meth:`release` commits and waits for the locker to exit. :meth:`close`
    kills any locker still running (for a test's ``finally``).
    """

    def __init__(self, db: Path) -> None:
        self.db = db
        self._lockers: list[asyncio.subprocess.Process] = []  # the holding one is last

    async def acquire(self, within: float = 30.0) -> None:
        locker = await asyncio.create_subprocess_exec(
            sys.executable, "-c", _LOCKER, str(self.db),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)
        self._lockers.append(locker)
        assert locker.stdout is not None
        line = await asyncio.wait_for(locker.stdout.readline(), within)
        assert line.strip() == b"locked", line

    async def release(self, within: float = 30.0) -> None:
        locker = self._lockers[-1]
        assert locker.stdin is not None
        locker.stdin.close()
        assert await asyncio.wait_for(locker.wait(), within) == 0

    async def close(self) -> None:
        for locker in self._lockers:
            if locker.returncode is None:
                locker.kill()
                await locker.wait()


def mount_tmpfs(mountpoint: Path, size: str = "64m") -> str | None:
    """Mount a tmpfs of ``size`` at ``mountpoint`` (created); ``None``, or why it could not.

    Needs root (``CAP_SYS_ADMIN``), as in CI; a suite skips the case otherwise.
    """
    mount = shutil.which("mount")
    if mount is None or shutil.which("umount") is None:
        return "mount(8) and umount(8) are not installed"
    mountpoint.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(
        [mount, "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(mountpoint)],
        capture_output=True, text=True, timeout=30, check=False)
    return None if mounted.returncode == 0 else f"mount failed: {mounted.stderr.strip()}"


def unmount(mountpoint: Path) -> None:
    """Unmount what :func:`mount_tmpfs` mounted (lazily: open files do not keep it)."""
    umount = shutil.which("umount")
    if umount is not None:
        subprocess.run([umount, "-l", str(mountpoint)], capture_output=True, timeout=30,
                       check=False)


def fill_filesystem(ballast: Path) -> int:
    """Write ``ballast`` until its filesystem is full; returns the bytes written."""
    chunk = b"\0" * 2**20
    written = 0
    with ballast.open("wb", buffering=0) as handle:
        while True:
            try:
                written += handle.write(chunk)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                break
    return written


def truncate_wal(db: Path) -> None:
    """Checkpoint the store's WAL and truncate it, so that its next write needs new space.

    Without this, SQLite would go on writing into WAL space allocated
    before the disk filled up, and a full-disk fault would come late or never.
    """
    connection = sqlite3.connect(db, timeout=10, isolation_level=None)
    try:
        for _ in range(50):
            busy, _log, _done = connection.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
            if not busy:
                return
            time.sleep(0.05)
    finally:
        connection.close()
