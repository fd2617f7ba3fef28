"""The no-loss chaos suites' run, verdict and chaos watcher, shared by every broker (issue 11).

A broker's suite (``tests/<broker>/test_no_loss.py``) deploys one source
(a topic, a queue) with its dead-letter destination, a config and a SQLite
store, runs the real ``sharedstream triggerer`` over its
``no_loss_defs.py`` and then accounts exactly with
:mod:`tests.chaos_accounting`. Everything that is not the broker lives here:

* :class:`NoLossRun` - the triggerer process (start, stop with SIGTERM,
  peak RSS, the stop summary), waiting for progress or a stall, the
  expected outcome and the final verdict. A broker subclasses it with what
  only it knows: how to send, how much is *settled* (committed offsets,
  deleted messages), how to read its dead-letter destination.
* :func:`through_store_faults`, :func:`store_locked_case`,
  :func:`store_full_case` and :func:`small_tmpfs` - cases C, the store
  unusable for longer than the ack timeout, the same for every broker.
* :func:`fuzzed_case` - case D, a broker's fuzzed records sent and accounted.
* :class:`ChaosMixin` and :func:`chaos_assets` - the ``custom`` watcher's
  slowness and poison, mixed into a broker's stock trigger by its
  definitions file (which the triggerer imports by path, the repository
  root on ``PYTHONPATH``), and the two watched assets.

Invariants:

1. A run owns at most one triggerer process; :meth:`NoLossRun.close` (the
   end of ``async with``) kills it if it still runs, whatever happened.
2. Every wait is bounded: progress by ``STALL`` and ``within``, the stop
   by 30 s before a kill, the store by its ``within``.
3. The verdict lists every problem a case has before failing, never only
   the first: a stall is reported together with what it lost.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import os
import random
import re
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Protocol, Self, TypeVar

import pytest

from sharedstream import BaseEventTrigger, TriggerEvent
from sharedstream.definitions import Asset, AssetWatcher
from tests.chaos_accounting import (
    IN_BROKER,
    DeadLetterRecord,
    Expected,
    ExpectedDeadLetter,
    PeakRss,
    Reality,
    StoreLock,
    compare,
    count_stored_events,
    fill_filesystem,
    mount_tmpfs,
    read_dead_letter_table,
    read_stored_events,
    trigger_ids,
    truncate_wal,
    unmount,
)
from tests.cli import ROOT, TriggererCli

__all__ = [
    "ACK_TIMEOUT",
    "CUSTOM",
    "FAULTS",
    "FAULT_SECONDS",
    "MAX_REDELIVERIES",
    "POISON_TEXT",
    "REJECTED",
    "STALL",
    "ChaosMixin",
    "Deploy",
    "NoLossRun",
    "Sent",
    "broker_dead_letter",
    "chaos_assets",
    "fuzzed_case",
    "nested_json",
    "small_tmpfs",
    "store_full_case",
    "store_locked_case",
    "through_store_faults",
]

CUSTOM = "sharedstream_definitions.no_loss_defs.ChaosWatcher"
"""The class path of the ``custom`` watcher, as the store records it."""
POISON_TEXT = "poison record"
"""The text of the error :class:`ChaosMixin` raises (the suites look for it in dead letters)."""
# The dead-letter contract (issue 11), spelled out rather than imported from the code under test.
REJECTED, MAX_REDELIVERIES = "rejected", "max_redeliveries"
DEAD_LETTER_TRIGGERS = "sharedstream.triggers"
DEAD_LETTER_DETAIL = "sharedstream.detail"

STALL = 15.0
"""Seconds without any progress that count as a stall."""
TRIGGERER_ENV = {
    "SHAREDSTREAM__TRIGGERER__SHARED_STREAM_ACK_TIMEOUT": "10",
    "SHAREDSTREAM__TRIGGERER__RESTART_BACKOFF_INITIAL": "0.05",
    "SHAREDSTREAM__TRIGGERER__RESTART_BACKOFF_MAX": "0.5",
    "SHAREDSTREAM__TRIGGERER__SHUTDOWN_TIMEOUT": "10",
}
"""The triggerer's settings in every case: quick restarts, a bounded shutdown."""

ACK_TIMEOUT = 3.0
"""The ack timeout in cases C (shorter than a fault)."""
FAULT_ENV = {"SHAREDSTREAM__TRIGGERER__SHARED_STREAM_ACK_TIMEOUT": str(ACK_TIMEOUT)}
FAULT_SECONDS = 6.0
"""How long the store is unusable: twice the ack timeout (and over SQLite's 5 s busy timeout)."""
STOPS_WITHIN = 1.0
"""Seconds a fault may take to stop the store; it must stay stopped from then on.

A full disk can let a write or two through: the steady flow keeps committing
while the ballast fills the disk, and the log space those commits allocated
is written again once a checkpoint has copied it back. From one second into
the fault, ``FAULT_SECONDS - STOPS_WITHIN`` (longer than the ack timeout)
must pass with nothing stored.
"""
FAULTS = 2
"""Faults per case, one after the other."""
RECOVERY_SECONDS = 3.0
"""How long records keep flowing after each recovery."""


class Sent(Protocol):
    """What a suite sends (a Kafka record, an SQS message): its label and its fate."""

    @property
    def label(self) -> str:
        """What kind of input it is (``"valid"`` unless fuzzed)."""

    @property
    def rejected(self) -> bool:
        """It cannot be decoded or stored: dead-lettered once, stored by nobody."""


SentT = TypeVar("SentT", bound=Sent)


class NoLossRun(abc.ABC, Generic[SentT]):
    """One case's deployment: a config and store, the triggerer CLI, and the verdict.

    ``produced`` maps each source name (the one the broker's producer gives
    a record: ``topic/partition/offset``, a message id) to what was sent
    there; a subclass fills it in :meth:`send`. Used as ``async with``: the
    end of the block calls :meth:`close`. Not safe to share between tasks
    except :meth:`send`, which a steady flow may run beside the case.
    """

    PLAIN: ClassVar[str]
    """The class path of the stock trigger (the ``plain`` watcher)."""
    NOUN: ClassVar[str]
    """What the broker carries, in the plural (``"records"``, ``"messages"``)."""
    SETTLED: ClassVar[str]
    """What :meth:`settled` counts, as a participle (``"committed"``, ``"deleted"``)."""
    WITHIN: ClassVar[float]
    """Seconds a case may take to settle everything after its last record is sent."""
    RSS_BOUND: ClassVar[int]
    """Peak resident set size the triggerer may reach in any case (bytes)."""
    POLL: ClassVar[float]
    """Seconds between two reads of :meth:`settled` while waiting."""
    RATE: ClassVar[int]
    """Records per second sent while a store fault lasts (cases C)."""
    WARM_UP: ClassVar[int]
    """Records settled before the first store fault."""
    BURST: ClassVar[int]
    """Records sent as each store fault starts."""

    def __init__(self, workdir: Path, definitions: Path, *, broker_env: Mapping[str, str],
                 db_url: str | None = None, env: Mapping[str, str] | None = None) -> None:
        self.dir = workdir
        self.definitions = definitions
        self.config = workdir / "sharedstream.toml"
        self.db_url = db_url or f"sqlite:///{workdir / 'sharedstream.db'}"
        self.db = Path(self.db_url.removeprefix("sqlite:///"))
        self.env = {**os.environ, "PYTHONPATH": str(ROOT), **broker_env, **TRIGGERER_ENV,
                    **(env or {})}
        self.produced: dict[str, SentT] = {}
        """Source name -> what was sent there."""
        self.next_id = 0
        self.process: subprocess.Popen[bytes] | None = None
        self.rss: PeakRss | None = None
        self.exit_code: int | None = None

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, kind: type[BaseException] | None, error: BaseException | None,
                        traceback: TracebackType | None) -> None:
        await self.close()

    # -- what a broker supplies ----------------------------------------------------------

    @abc.abstractmethod
    async def setup(self) -> None:
        """Create the source, its dead-letter destination and the store (before :meth:`start`)."""

    @abc.abstractmethod
    async def send(self, items: Sequence[SentT]) -> None:
        """Send ``items`` in order; record each one's source in ``produced``."""

    @abc.abstractmethod
    def plain(self, start: int, count: int) -> list[SentT]:
        """``count`` valid ``{"id": n}`` records, ``n`` from ``start``."""

    @abc.abstractmethod
    async def settled(self) -> int:
        """How many of the records sent are done with (committed, deleted), read once."""

    @abc.abstractmethod
    def rejected_letter(self, item: SentT, where: str, roles: tuple[int, int],
                        ) -> ExpectedDeadLetter:
        """The dead letter a rejected ``item`` must leave (``roles``: plain, custom)."""

    @abc.abstractmethod
    async def dead_letters_in_broker(self) -> tuple[list[DeadLetterRecord], list[str]]:
        """Every dead letter the broker holds, and what is wrong with any of them."""

    async def broker_problems(self) -> list[str]:
        """What the broker shows wrong once the triggerer has stopped (none by default)."""
        return []

    def notes(self) -> str:
        """More to say in a failed verdict (after the peak RSS)."""
        return ""

    # -- the triggerer -------------------------------------------------------------------

    def cli(self, *args: str) -> str:
        """Run ``sharedstream <args>`` to completion (asserting success); its stdout."""
        return TriggererCli(self.dir, self.env, self.definitions).run(*args)

    async def init_store(self) -> None:
        """``sharedstream init``: the config file and the store."""
        await asyncio.to_thread(self.cli, "init", "--path", str(self.config), "--db", self.db_url)

    @property
    def log(self) -> Path:
        return self.dir / "triggerer.log"

    def start(self) -> None:
        """Start ``sharedstream triggerer`` (INFO logs to ``triggerer.log``)."""
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "sharedstream", "--config", str(self.config),
                 "triggerer", "--definitions", str(self.definitions)],
                cwd=self.dir, env=self.env, stdout=subprocess.DEVNULL, stderr=log,
            )
        self.rss = PeakRss(self.process.pid)

    async def stop(self) -> None:
        """SIGTERM the triggerer and wait for it (killed after 30 s); sets ``exit_code``."""
        process = self.process
        if process is None or process.poll() is not None:
            self.exit_code = None if process is None else process.returncode
            return
        assert self.rss is not None
        self.rss.sample()
        process.send_signal(signal.SIGTERM)
        try:
            self.exit_code = await asyncio.to_thread(process.wait, 30)
        except subprocess.TimeoutExpired:
            process.kill()
            await asyncio.to_thread(process.wait, 10)
            self.exit_code = None

    async def close(self) -> None:
        """Kill the triggerer if it still runs (idempotent; the end of ``async with``)."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            await asyncio.to_thread(self.process.wait, 10)

    def stop_summary(self) -> str:
        """The triggerer's last ``stopped: ...`` log line (else its last line)."""
        lines = [line for line in self.log.read_text(errors="replace").splitlines() if line]
        summaries = [line for line in lines if "stopped stored=" in line]
        return (summaries or lines or ["(no log)"])[-1]

    # -- records -------------------------------------------------------------------------

    def fresh(self, count: int) -> list[SentT]:
        """``count`` ``{"id": n}`` records, their ids new in this run."""
        items = self.plain(self.next_id, count)
        self.next_id += count
        return items

    async def send_steadily(self, stop: asyncio.Event) -> None:
        """Send fresh records at ``RATE`` per second until ``stop`` is set."""
        while not stop.is_set():
            await self.send(self.fresh(self.RATE // 10))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.1)

    def source_where(self, sent: Callable[[SentT], bool]) -> str:
        """The source of the one record sent for which ``sent`` holds."""
        (source,) = [s for s, item in self.produced.items() if sent(item)]
        return source

    async def wait_settled(self, target: int, *, within: float | None = None) -> str | None:
        """Wait until ``target`` records are settled; a stall or a dead triggerer is returned.

        A stall is ``STALL`` seconds without progress, or ``within`` seconds
        (``WITHIN`` by default) in all.
        """
        within = self.WITHIN if within is None else within
        assert self.process is not None
        assert self.rss is not None
        started = last_move = time.monotonic()
        last = -1
        while True:
            settled = await self.settled()
            self.rss.sample()
            now = time.monotonic()
            if settled >= target:
                return None
            if settled != last:
                last, last_move = settled, now
            if self.process.poll() is not None:
                return (f"the triggerer exited ({self.process.returncode}) with "
                        f"{settled} of {target} {self.SETTLED}")
            if now - last_move > STALL or now - started > within:
                return (f"STALLED: {self.SETTLED} {settled} of {target} "
                        f"({now - last_move:.0f} s without progress, {now - started:.0f} s in all)")
            await asyncio.sleep(self.POLL)

    async def wait_stored(self, at_least: int, within: float = 5.0) -> None:
        """Give the store ``within`` seconds to hold ``at_least`` events (no assertion)."""
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            if await asyncio.to_thread(count_stored_events, self.db) >= at_least:
                return
            await asyncio.sleep(0.1)

    # -- accounting ----------------------------------------------------------------------

    def roles(self) -> tuple[int, int]:
        """The trigger ids of the ``plain`` and the ``custom`` watcher."""
        ids = trigger_ids(self.db)
        assert len(ids.get(self.PLAIN, [])) == 1, ids
        assert len(ids.get(CUSTOM, [])) == 1, ids
        return ids[self.PLAIN][0], ids[CUSTOM][0]

    def expected(self, *, skip: Callable[[int, SentT], bool] | None = None,
                 where: str = IN_BROKER) -> Expected:
        """Both watchers store every record not rejected; rejected ones are dead-lettered.

        ``skip(custom, item)``: the ``custom`` watcher stores no event for
        ``item``. A rejected record's dead letter goes ``where``.
        """
        roles = plain, custom = self.roles()
        expected = Expected(events={plain: set(), custom: set()})
        for source, item in self.produced.items():
            if item.rejected:
                expected.dead_letters[source] = self.rejected_letter(item, where, roles)
                continue
            expected.events[plain].add(source)
            if skip is None or not skip(custom, item):
                expected.events[custom].add(source)
        return expected

    def expected_poisoned(self, poisoned: Callable[[SentT], bool], *,
                          where: str = IN_BROKER) -> Expected:
        """:meth:`expected` when the ``custom`` watcher raises on the one ``poisoned`` record.

        That record is stored by ``plain`` alone and dead-lettered ``where``
        (``max_redeliveries``), naming ``custom`` and its error.
        """
        _, custom = self.roles()
        expected = self.expected(skip=lambda trigger, item: poisoned(item), where=where)
        expected.dead_letters[self.source_where(poisoned)] = ExpectedDeadLetter(
            MAX_REDELIVERIES, where=where, triggers=frozenset({custom}), detail=POISON_TEXT)
        return expected

    async def finish(self, expected: Expected, context: str, *,
                     stall: str | None = None, extra: Sequence[str] = ()) -> None:
        """Stop the triggerer and assert everything: broker, accounting, exit, memory.

        Every problem is listed in one ``AssertionError``, prefixed with ``context``.
        """
        await self.wait_stored(sum(len(sources) for sources in expected.events.values()),
                               within=0.0 if stall else 5.0)
        await self.stop()
        problems = [stall] if stall else []
        problems += extra
        problems += await self.broker_problems()
        events = await asyncio.to_thread(read_stored_events, self.db)
        in_broker, letter_problems = await self.dead_letters_in_broker()
        in_store = await asyncio.to_thread(read_dead_letter_table, self.config, self.db, self.env)
        problems += letter_problems
        reality = Reality(events=events, dead_letters=[*in_broker, *in_store])
        problems += compare(expected, reality)
        # The stop summary's count, read loosely (its wording is not a contract).
        said = re.search(r"\bstopped\b.*?\bstored=(\d+)", self.stop_summary())
        if said and int(said[1]) != len(reality.events):
            problems.append(f"the stop summary says {said[1]} events stored, the store holds "
                            f"{len(reality.events)}")
        if self.exit_code != 0:
            problems.append(f"the triggerer did not stop cleanly on SIGTERM "
                            f"(exit {self.exit_code})")
        assert self.rss is not None
        if self.rss.peak > self.RSS_BOUND:
            problems.append(f"peak RSS {self.rss.peak / 2**20:.0f} MB > "
                            f"{self.RSS_BOUND / 2**20:.0f} MB")
        assert not problems, (
            f"{context}: {len(self.produced)} {self.NOUN}\n  " + "\n  ".join(problems)
            + f"\n  stop summary: {self.stop_summary()[:400]}"
            + f"\n  peak RSS {self.rss.peak / 2**20:.0f} MB{self.notes()}; log: {self.log}"
        )


def broker_dead_letter(source: str, fields: Mapping[str, str | None], reason: str,
                       payload_size: int | None) -> DeadLetterRecord:
    """A dead letter read from the broker: ``fields`` are its headers or attributes.

    ``reason`` names the field holding the reason; the failing triggers and
    the detail are under the names every broker shares.
    """
    triggers = fields.get(DEAD_LETTER_TRIGGERS)
    return DeadLetterRecord(
        source=source, reason=fields.get(reason), where=IN_BROKER,
        triggers=None if triggers is None else frozenset(
            int(t) for t in triggers.split(",") if t.strip().isdigit()),
        detail=fields.get(DEAD_LETTER_DETAIL), payload_size=payload_size,
    )


# -- C: the store stalls longer than the ack timeout ----------------------------------------


async def through_store_faults(run: NoLossRun[Any], fault: Callable[[], Awaitable[None]],
                               recover: Callable[[], Awaitable[None]], context: str) -> None:
    """``WARM_UP`` records, then ``FAULTS`` times: the fault, recovery and ``RECOVERY_SECONDS``.

    A burst of ``BURST`` records comes as each fault starts, and a steady
    flow (``RATE``) runs from the first fault to the end of the last
    recovery. Asserts that each fault stopped the store within
    ``STOPS_WITHIN`` for the rest of it, then :meth:`NoLossRun.finish`.
    """
    await run.setup()
    run.start()
    await run.send(run.fresh(run.WARM_UP))
    stall = await run.wait_settled(run.WARM_UP)
    assert stall is None, f"{context}: before the fault: {stall}"
    stop = asyncio.Event()
    flowing: asyncio.Task[None] | None = None
    try:
        for cycle in range(1, FAULTS + 1):
            await fault()
            fault_started = time.monotonic()
            await run.send(run.fresh(run.BURST))
            if flowing is None:
                flowing = asyncio.create_task(run.send_steadily(stop), name="steady-flow")
            await asyncio.sleep(max(0.0, STOPS_WITHIN - (time.monotonic() - fault_started)))
            stored_then = await asyncio.to_thread(count_stored_events, run.db)
            await asyncio.sleep(max(0.0, FAULT_SECONDS - (time.monotonic() - fault_started)))
            stored_now = await asyncio.to_thread(count_stored_events, run.db)
            await recover()
            # The test's own check: a fault that let the store write tests nothing.
            assert stored_now == stored_then, (f"{context}: fault {cycle} did not stop the "
                                               f"store ({stored_then} -> {stored_now} events)")
            await asyncio.sleep(RECOVERY_SECONDS)  # records keep coming meanwhile
    finally:
        stop.set()
        if flowing is not None:
            await flowing
    stall = await run.wait_settled(len(run.produced))
    await run.finish(run.expected(), context, stall=stall)


class Deploy(Protocol):
    """A suite's way to deploy one case: a :class:`NoLossRun` to use with ``async with``."""

    def __call__(self, *, db_url: str | None = None, env: Mapping[str, str] | None = None,
                 ) -> AbstractAsyncContextManager[NoLossRun[Any]]: ...


async def store_locked_case(deploy: Deploy) -> None:
    """Case C1: the store locked by another process (``BEGIN EXCLUSIVE``), ``FAULTS`` times."""
    async with deploy(env=FAULT_ENV) as run:
        lock = StoreLock(run.db)
        try:
            await through_store_faults(
                run, lock.acquire, lock.release,
                f"C1 (store locked by another process {FAULTS} times for "
                f"{FAULT_SECONDS:.0f} s, ack timeout {ACK_TIMEOUT:.0f} s)")
        finally:
            await lock.close()


async def store_full_case(deploy: Deploy, tmp_path: Path) -> None:
    """Case C2: the store on a small tmpfs, filled with a ballast file ``FAULTS`` times.

    Needs root to mount the tmpfs (as in CI); skips the test where it cannot.
    """
    with small_tmpfs(tmp_path) as mountpoint:
        ballast = mountpoint / "ballast"
        async with deploy(db_url=f"sqlite:///{mountpoint / 'sharedstream.db'}",
                          env=FAULT_ENV) as run:

            async def fill() -> None:
                await asyncio.to_thread(truncate_wal, run.db)
                assert await asyncio.to_thread(fill_filesystem, ballast) > 0

            async def free() -> None:
                await asyncio.to_thread(ballast.unlink)

            await through_store_faults(
                run, fill, free,
                f"C2 (store's filesystem full {FAULTS} times for {FAULT_SECONDS:.0f} s, "
                f"ack timeout {ACK_TIMEOUT:.0f} s)")


@contextlib.contextmanager
def small_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 64 MB tmpfs mounted for a test (needs root, as in CI); skips the test where it cannot."""
    mountpoint = tmp_path / "small-fs"
    why = mount_tmpfs(mountpoint, "64m")
    if why is not None:
        pytest.skip(f"C2 simulates a full disk with a small tmpfs, which needs root: {why}")
    try:
        yield mountpoint
    finally:
        unmount(mountpoint)


# -- D: fuzzed input ------------------------------------------------------------------------


def nested_json(depth: int) -> str:
    """``depth`` JSON arrays, one in another (``[[...]]``)."""
    return "[" * depth + "]" * depth


async def fuzzed_case(run: NoLossRun[SentT], fuzzed: Callable[[int], Sequence[SentT]],
                      what: str) -> None:
    """Case D: ``fuzzed(seed)`` sent in two halves, each stored or rejected once.

    The seed is ``SHAREDSTREAM_NOLOSS_SEED`` if set (to replay a run), else
    random; a failure names it, and the label of every record not valid.
    """
    seed = int(os.environ.get("SHAREDSTREAM_NOLOSS_SEED", random.randrange(1 << 30)))
    items = fuzzed(seed)
    await run.setup()
    run.start()
    await run.send(items[: len(items) // 2])
    await run.send(items[len(items) // 2:])
    stall = await run.wait_settled(len(items))
    labels = {s: item.label for s, item in run.produced.items() if item.label != "valid"}
    context = (f"D ({what}, seed {seed}: SHAREDSTREAM_NOLOSS_SEED={seed} replays it); "
               f"labels: {labels}")
    await run.finish(run.expected(), context, stall=stall)


# -- the custom watcher ---------------------------------------------------------------------


class ChaosMixin(BaseEventTrigger):
    """A broker's stock trigger, made slow (``delay``) or poisoned (``raise_on_id``).

    Mixed in before the stock trigger (``class ChaosWatcher(ChaosMixin,
    KafkaSharedStreamTrigger)``): the stock filter (decoding, rejecting,
    matching) runs over a stream that sleeps ``delay`` seconds per record
    and raises ``RuntimeError(POISON_TEXT ...)`` on the record whose JSON
    ``id`` is ``raise_on_id``; otherwise it behaves like the stock trigger.
    """

    if TYPE_CHECKING:
        def decode(self, message: Any) -> Any:
            """The stock trigger's decoder (raises ``ValueError`` if it cannot)."""

    def __init__(self, *, delay: float = 0.0, raise_on_id: int | None = None,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.delay = delay
        self.raise_on_id = raise_on_id

    def serialize(self) -> tuple[str, dict[str, Any]]:
        # The stock trigger's (after this mixin in the class's order), not the abstract one.
        classpath, kwargs = super().serialize()  # type: ignore[safe-super]
        return classpath, {**kwargs, "delay": self.delay, "raise_on_id": self.raise_on_id}

    async def filter_shared_stream(
        self, shared_stream: AsyncIterator[Any]
    ) -> AsyncIterator[TriggerEvent]:
        async for event in super().filter_shared_stream(self._chaos(shared_stream)):
            yield event

    async def _chaos(self, shared_stream: AsyncIterator[Any]) -> AsyncIterator[Any]:
        async for message in shared_stream:
            if self.delay:
                await asyncio.sleep(self.delay)
            if self.raise_on_id is not None and self._record_id(message) == self.raise_on_id:
                raise RuntimeError(f"{POISON_TEXT}: id {self.raise_on_id}")
            yield message

    def _record_id(self, message: Any) -> object:
        try:
            value = self.decode(message)
        except (ValueError, RecursionError):
            return None  # undecodable: the stock filter rejects it
        return value.get("id") if isinstance(value, dict) else None


def chaos_assets(stock: type[BaseEventTrigger], chaos: type[ChaosMixin],
                 settings: Mapping[str, Any]) -> tuple[Asset, Asset]:
    """A definitions file's ``plain`` and ``custom`` assets, each one watcher of ``settings``.

    ``plain`` watches with the ``stock`` trigger; ``custom`` with ``chaos``,
    made slow by ``NOLOSS_DELAY`` (seconds, default 0) and poisoned by
    ``NOLOSS_RAISE_ON_ID`` (an integer, default none). Called while the
    triggerer imports the file, which keeps every asset built meanwhile.
    """
    raise_on = os.environ.get("NOLOSS_RAISE_ON_ID")
    custom = chaos(**settings, delay=float(os.environ.get("NOLOSS_DELAY", "0")),
                   raise_on_id=int(raise_on) if raise_on else None)
    return (Asset("plain", watchers=[AssetWatcher("all", trigger=stock(**settings))]),
            Asset("custom", watchers=[AssetWatcher("all", trigger=custom)]))
