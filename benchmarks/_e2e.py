"""What the end-to-end benchmarks share: the messages, the expected events, the baseline's store.

Every e2e benchmark (``kafka_e2e.py``, ``sqs_e2e.py``, ``pubsub_e2e.py``,
``servicebus_e2e.py``) pre-loads the same N JSON messages ``{"id": i,
"bucket": i % 10, ...}``;
watcher (or independent consumer) j keeps the messages of bucket ``j % 10``,
so K of them store :func:`expected_events` events. The ``independent K``
baseline - what users run today - stores its 1 in 10 with an
:class:`IndependentStore` each. Where a benchmark's consumers count their
own acknowledgements (:data:`ACKED`), :func:`wait_acked` says when a case is
done; :mod:`_e2e_report` turns the runs into the medians, ratios and files.
"""

from __future__ import annotations

import asyncio
import compileall
import contextlib
import json
import os
import sqlite3
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BUCKETS = 10

ACKED: Counter[str] = Counter()
"""Messages acknowledged, by subscription, as reported by a benchmark's generated definitions.

The definitions file is imported by the runtime as its own module; it
reaches the benchmark through this module, which both import once.
"""


def message_body(index: int, customers: int | None = None) -> str:
    """Message ``index`` as JSON; ``bucket`` is what the watchers match on.

    With ``customers``, it also names one of that many customers
    (``index % customers``): what selective watchers match on (see
    :func:`write_definitions`).
    """
    body: dict[str, Any] = {"id": index, "bucket": index % BUCKETS, "kind": "order",
                            "amount": (index * 37) % 1000}
    if customers is not None:
        body["customer"] = index % customers
    return json.dumps(body)


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



@contextlib.contextmanager
def independent_stores(path: Path, k: int, loads: Callable[[bytes], Any] = json.loads,
                       ) -> Iterator[list[IndependentStore]]:
    """K consumers' :class:`IndependentStore` on one SQLite file, closed when the block ends."""
    stores = [IndependentStore(path, index, loads) for index in range(k)]
    try:
        yield stores
    finally:
        for store in stores:
            store.db.close()


def stored_rows(path: Path) -> int:
    """The events the independent consumers stored in ``path``, all of them."""
    with contextlib.closing(sqlite3.connect(path)) as db:
        (count,) = db.execute("SELECT count(*) FROM events").fetchone()
    return int(count)

def say(text: str) -> None:
    """A progress line on stderr (stdout carries the result table)."""
    print(text, file=sys.stderr, flush=True)


def compile_checkout() -> None:
    """Byte-compile the checkout's ``sharedstream`` package, as pip does when it installs one.

    For benchmarks whose clock includes starting ``sharedstream`` processes:
    from an editable checkout, a process otherwise compiles every module it
    imports, at every start where ``PYTHONDONTWRITEBYTECODE`` is set (or at
    its first start) - about 0.2 s here, and the installed peers (Airflow's
    virtualenv) start from compiled code. Modules already compiled are
    skipped; the ``__pycache__`` folders it writes are git-ignored.
    """
    import sharedstream  # noqa: PLC0415 - only where a benchmark starts our processes

    package = Path(sharedstream.__file__).parent
    # compileall does not follow linked folders (producers/, triggers/): their targets too
    folders = [package, *(p.resolve() for p in package.iterdir() if p.is_symlink() and p.is_dir())]
    if not all(compileall.compile_dir(folder, quiet=1) for folder in folders):
        raise RuntimeError(f"cannot byte-compile {package}: see the lines above")


def chosen_backends(choice: str, *, local: str, container: str, label: str,
                    unavailable: Callable[[], str | None] | None = None) -> list[str] | str:
    """The backends a benchmark's backend option runs, in order, or why the one asked for cannot.

    ``choice`` is ``"auto"`` (``local``, then ``container`` when a Docker
    engine answers: else skipped with one line saying why), ``local`` or
    ``container``. A string is the reason the ``container`` backend, asked
    for by name, cannot run here (the benchmark exits with status 2).
    ``label`` names that backend in those lines (``"Pub/Sub emulator"``);
    ``unavailable`` says why containers cannot run (the testing kit's
    :func:`~sharedstream.testing.brokers.containers_unavailable` by default).
    """
    if choice not in ("auto", local, container):
        return f"unknown backend {choice!r} (auto, {local} or {container})"
    chosen = [local] if choice in ("auto", local) else []
    if choice in ("auto", container):
        if unavailable is None:
            from sharedstream.testing.brokers import containers_unavailable  # noqa: PLC0415

            unavailable = containers_unavailable
        why_not = unavailable()
        if why_not is None:
            chosen.append(container)
        elif choice == container:
            return f"cannot run the {label} backend: {why_not}"
        else:
            say(f"skipping the {label} backend: {why_not}")
    return chosen


@dataclass
class Progress:
    """When the sources were done (s since the case started): the case is the slowest."""

    first_ack_at: float | None = None
    done_at: dict[str, float] = field(default_factory=dict)


async def wait_acked(sources: list[str], messages: int, *, started: float, limit: float,
                     label: str, ended: asyncio.Future[Any] | None = None,
                     poll: float = 0.02) -> Progress:
    """Poll :data:`ACKED` every ``poll`` s until each source counts N acks; report every second.

    ``sources`` are what the consumers count under (a subscription, a queue);
    ``ended`` is the consumers' task: its end before then fails the case, as
    does ``limit`` seconds passing (``TimeoutError``).
    """
    progress = Progress()
    last_report = 0.0
    while True:
        now = time.perf_counter() - started
        if progress.first_ack_at is None and any(ACKED[s] for s in sources):
            progress.first_ack_at = now
        for s in sources:
            if s not in progress.done_at and ACKED[s] >= messages:
                progress.done_at[s] = now
        if len(progress.done_at) == len(sources):
            return progress
        if ended is not None and ended.done():
            raise RuntimeError(f"{label}: the consumers ended early ({ended.result()!r})")
        slowest = min(ACKED[s] for s in sources)
        if now - last_report >= 1.0:
            last_report = now
            say(f"  [{label} {now:5.1f}s] acked {slowest:>7}/{messages} "
                f"(slowest of {len(sources)} source(s))")
        if now > limit:
            raise TimeoutError(f"{label}: {slowest}/{messages} acked after {limit:.0f}s")
        await asyncio.sleep(poll)


# -- the shared case: generated definitions, the in-process triggerer ------------------------


class LabelledWatcher:
    """Put before a broker's trigger class in a benchmark's generated definitions.

    The runtime collapses identical watchers into one trigger, so watchers j
    and j + 10 (equal filters) would be one; the ``watcher`` label, which is
    not part of the shared-stream key, keeps all K distinct, as K users'
    watchers would be.
    """

    def __init__(self, *, watcher: int, **kwargs: Any) -> None:
        self.watcher = watcher  # before super(): a trigger's validation may call serialize()
        super().__init__(**kwargs)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        """The trigger's own classpath and kwargs, plus ``watcher``."""
        classpath, kwargs = super().serialize()  # type: ignore[misc]  # the trigger class's
        return classpath, {**kwargs, "watcher": self.watcher}


def write_definitions(path: Path, header: str, common: dict[str, Any], k: int, *,
                      selective: bool = False) -> None:
    """``header`` (imports, a ``BenchWatcher`` class), then K watchers built from ``common``.

    Watcher j matches ``bucket == j % 10`` and feeds asset ``bucket_j``; with
    ``selective``, it matches ``customer == j`` instead (one customer each,
    for messages made with ``message_body(i, customers=K)``).
    """
    def match(j: int) -> str:
        return f"{{'customer': {j}}}" if selective else f"{{'bucket': {j % BUCKETS}}}"

    path.write_text(
        header + f"COMMON = {common!r}\n\n"
        + "".join(
            f"bucket_{j} = Asset('bucket_{j}', watchers=[AssetWatcher('w', "
            f"trigger=BenchWatcher(**COMMON, watcher={j}, "
            f"match={{'json': {match(j)}}}))])\n"
            for j in range(k)))


async def run_triggerer(definitions: Path, sources: list[str], messages: int, *,
                        label: str, limit: float) -> tuple[Progress, int]:
    """The in-process triggerer on ``definitions`` until each source counts N acks.

    Its config and SQLite store go next to ``definitions``. Returns the
    progress and the trigger events stored; the triggerer is stopped and
    awaited however the wait ends.
    """
    from _triggerer_config import make_config  # noqa: PLC0415 - the runtime, only here

    from sharedstream.runtime.definitions import load_definitions  # noqa: PLC0415 - user code
    from sharedstream.runtime.triggerer import Triggerer  # noqa: PLC0415
    from sharedstream.store.sqlite import SqliteStore  # noqa: PLC0415

    config = make_config(definitions.parent)
    triggerer = Triggerer(config, load_definitions(definitions))
    started = time.perf_counter()
    task = asyncio.create_task(triggerer.run(), name=f"e2e-triggerer-{label}")
    try:
        progress = await wait_acked(sources, messages, started=started, limit=limit,
                                    label=label, ended=task)
    finally:
        triggerer.request_stop()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    with SqliteStore(config.sqlite_path()) as store:
        return progress, store.counts()["trigger_events"]


@contextlib.contextmanager
def store_skipped() -> Iterator[None]:
    """While inside: ``SqliteStore.write_events`` keeps nothing and reports it all stored.

    The ``unstored K`` case of ``--diagnose`` (``kafka_e2e.py``, ``pubsub_e2e.py``) and
    nothing else: it measures what the store's writes cost a shared case, and a triggerer
    run inside acks messages whose events were never stored.
    """
    from sharedstream.store.base import PendingEvent, WriteResult  # noqa: PLC0415
    from sharedstream.store.sqlite import SqliteStore  # noqa: PLC0415

    def write_nothing(_store: SqliteStore, batch: Sequence[PendingEvent]) -> WriteResult:
        return WriteResult(stored=len(batch), duplicates=0, asset_events=len(batch), dag_runs=())

    real = SqliteStore.write_events
    SqliteStore.write_events = write_nothing  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        SqliteStore.write_events = real  # type: ignore[method-assign]
