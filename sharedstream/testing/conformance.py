"""The producer conformance suite: subclass :class:`ProducerConformance`, provide ``harness``.

A broker package runs it against its own producer::

    from sharedstream.testing.conformance import ProducerConformance
    from sharedstream.testing.harness import opened

    class TestMyBrokerConformance(ProducerConformance):
        pass  # every test of the suite, against my broker

    @pytest.fixture
    async def harness(my_broker_endpoint):  # a BrokerHarness, one per test
        # its .features: a Features; opened() starts it, and closes it however the test ends
        async with opened(MyBrokerHarness(my_broker_endpoint)) as harness:
            yield harness

(the fixture may live in the test module or its ``conftest.py``; it needs
pytest-asyncio in ``auto`` mode, or the tests marked ``asyncio``).

Every test runs a real :class:`SharedStreamManager` with runner tasks that
behave like the triggerer (durable members that store at once and restart a
failed filter), against the real broker, and checks the committed position
with the harness's own, separate reader. Whatever the broker, a member that
is away, slow or failing must never let the broker advance past a message
it has not stored. Tests of what the harness's :class:`Features` say the
broker does not do are skipped, saying which feature is missing.
"""

# ruff: noqa: S101 - a pytest suite: its assertions are the checks it exists for

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator, Iterator
from itertools import count
from typing import Any

import pytest

from sharedstream.engine.manager import SharedStreamManager
from sharedstream.testing.harness import BrokerHarness, Stream
from sharedstream.testing.runner import SupervisedRunner, eventually, eventually_async
from sharedstream.testing.scripts import SCRIPTS, Script

__all__ = ["MEASUREMENTS", "ProducerConformance", "Session", "same", "unique_ids", "values"]

unique_ids: Iterator[int] = count(1)
"""Script names and trigger ids, unique within the test process."""

MEASUREMENTS: dict[str, list[int]] = {}
"""Numbers the suite observed (for documentation), e.g. duplicates a failure causes."""


def values(n: int, prefix: str = "m") -> list[bytes]:
    """``[b"m0", b"m1", ...]``: ``n`` distinct message values."""
    return [f"{prefix}{i}".encode() for i in range(n)]


def same(harness: BrokerHarness, seen: list[Any], expected: list[Any]) -> bool:
    """``seen == expected``, in any order where the broker does not promise one."""
    if harness.features.ordered_delivery:
        return seen == expected
    return sorted(seen) == sorted(expected)


class Session:
    """One manager and the runners of one test; :meth:`close` stops them all."""

    def __init__(self, harness: BrokerHarness, stream: Stream, *, queue: int = 1024) -> None:
        self.harness, self.stream = harness, stream
        self.manager = SharedStreamManager(ack_timeout=30.0, max_subscriber_queue=queue)
        self.runners: list[SupervisedRunner] = []

    def run(
        self, script: Script | None = None, *, backoff: float = 0.0, **trigger_kwargs: Any
    ) -> SupervisedRunner:
        """Start a runner of a new harness trigger following ``script`` (default: emit all)."""
        name = f"script-{next(unique_ids)}"
        SCRIPTS[name] = script or Script()
        trigger = self.harness.trigger(self.stream, script=name, **trigger_kwargs)
        runner = SupervisedRunner(self.manager, trigger, next(unique_ids), backoff=backoff).start()
        self.runners.append(runner)
        return runner

    async def close(self) -> None:
        """Stop every runner, then the manager's groups."""
        for runner in self.runners:
            await runner.stop()
        await self.manager.stop_all()


class ProducerConformance:
    """The suite. A subclass provides a ``harness`` fixture (a :class:`BrokerHarness`).

    The subclass's name must start with ``Test`` for pytest to collect it.
    Each test builds its own stream, so the tests are independent and may
    run in any order; none of them takes longer than ~20 s on a healthy
    broker (a per-test timeout of 60 s is ample).
    """

    @pytest.fixture
    async def session(  # noqa: D102 - a fixture: one stream and its Session per test
self, harness: BrokerHarness) -> AsyncIterator[Session]:
        stream = await harness.create_stream()
        session = Session(harness, stream)
        try:
            yield session
        finally:
            await session.close()

    async def test_all_acked_commits_everything(
        self, harness: BrokerHarness, session: Session
    ) -> None:
        """Two triggers take every message once; everything is committed, nothing dead-lettered."""
        stream = session.stream
        first, second = session.run(), session.run()
        await harness.produce(stream, values(5))
        await eventually(lambda: same(harness, first.values(), values(5))
                         and same(harness, second.values(), values(5)),
                         what="both triggers saw every message once")
        await eventually_async(lambda: harness.committed(stream), 5, what="committed")
        if harness.features.supports_dlq:
            assert await harness.dead_letters(stream) == []

    async def test_raw_event_names_are_stable(
        self, harness: BrokerHarness, session: Session
    ) -> None:
        """Each event's raw event key is the producer's name of its message, plus ``#index``."""
        if not harness.features.names_raw_events:
            pytest.skip("the producer does not name raw events")
        stream = session.stream
        runner = session.run(Script(skip={b"m1"}))
        await harness.produce(stream, values(3))
        await eventually(lambda: len(runner.events) == 2, what="two events")
        assert same(harness, runner.names, [
            f"{harness.raw_event_name(stream, 0)}#0", f"{harness.raw_event_name(stream, 2)}#0",
        ])

    async def test_reject_dead_letters_and_commits_past(
        self, harness: BrokerHarness, session: Session
    ) -> None:
        """A rejected message goes to the DLQ, naming its source, and is committed past."""
        if not harness.features.supports_dlq:
            pytest.skip("no dead-letter support")
        stream = session.stream
        healthy, picky = session.run(), session.run(Script(reject={b"m2"}))
        await harness.produce(stream, values(5))
        await eventually(lambda: same(harness, healthy.values(), values(5)),
                         what="the healthy trigger")
        await eventually_async(lambda: harness.committed(stream), 5, what="committed past")
        letters = await harness.dead_letters(stream)
        assert [(d.value, d.source, d.reason) for d in letters] == [
            (b"m2", harness.raw_event_name(stream, 2), "rejected")
        ]
        assert same(harness, picky.values(), [v for v in values(5) if v != b"m2"])

    async def test_reject_without_dead_letter_commits_past(self, harness: BrokerHarness) -> None:
        """Without a DLQ, rejected messages are discarded and committed past."""
        stream = await harness.create_stream(dead_letter=False)
        session = Session(harness, stream)
        try:
            session.run(Script(reject={b"m0", b"m3"}))
            await harness.produce(stream, values(4))
            await eventually_async(lambda: harness.committed(stream), 4, what="committed past")
        finally:
            await session.close()

    async def test_failure_holds_the_floor_and_is_redelivered(
        self, harness: BrokerHarness, session: Session
    ) -> None:
        """A failed message comes again in the same session; nothing is committed past it first."""
        if not harness.features.redelivers_in_session:
            pytest.skip("no redelivery within a session")
        stream = session.stream
        healthy = session.run()
        flaky_script = Script(fail={b"m2": 1})
        flaky = session.run(flaky_script)
        await harness.produce(stream, values(6))
        await eventually(lambda: set(flaky.values()) == set(values(6)),
                         what="the flaky trigger, restarted, to get every message")
        await eventually_async(lambda: harness.committed(stream), 6, what="committed")
        assert flaky_script.failures == 1
        seen = healthy.values()
        if harness.features.redelivers_to_failed_only:
            # The redelivery went to the flaky trigger alone: the healthy one saw each once.
            assert same(harness, seen, values(6)), seen
            MEASUREMENTS.setdefault("duplicates_for_healthy_subscriber", []).append(0)
            return
        # The healthy trigger saw every message, some twice: the redelivery from the floor.
        assert sorted(set(seen)) == values(6)
        if harness.features.ordered_delivery:
            assert seen[:6] == values(6)
        again = Counter(seen) - Counter(values(6))
        MEASUREMENTS.setdefault("duplicates_for_healthy_subscriber", []).append(
            again.total())
        assert b"m2" in again, "the failed message is delivered again"
        if harness.features.ordered_delivery:
            assert set(again) <= set(values(6)[2:]), "nothing before the failure comes again"
        if harness.features.names_raw_events:
            # Redelivered copies carry the same names and fingerprints: a store skips them.
            assert len(set(healthy.names)) == 6
            assert len(set(healthy.identities)) == 6, healthy.identities

    async def test_floor_persists_across_batches(
        self, harness: BrokerHarness, session: Session
    ) -> None:
        """A message that keeps failing holds its lane's commit across later, clean batches."""
        if not harness.features.ordered_lanes:
            pytest.skip("acknowledgements are not cumulative")
        stream = session.stream
        healthy = session.run(max_redeliveries=1_000_000)  # same key: one shared consumer
        stuck = Script(fail={b"m1": -1})
        session.run(stuck, max_redeliveries=1_000_000)
        await harness.produce(stream, values(3))
        await eventually(lambda: stuck.failures >= 2, what="repeated failures on m1")
        await harness.produce(stream, values(3, prefix="late"))  # later batches, all clean
        mark = stuck.failures
        await eventually(lambda: stuck.failures >= mark + 3, what="more rounds")
        committed = await harness.committed(stream)
        assert committed == 1, f"nothing at or after the floor (committed: {committed})"
        stuck.fail[b"m1"] = 0  # the trigger is fixed
        await eventually_async(lambda: harness.committed(stream), 6, what="committed")
        assert b"late2" in healthy.values()

    async def test_poison_message_is_dead_lettered(
        self, harness: BrokerHarness, session: Session
    ) -> None:
        """After ``max_redeliveries`` failures a message is dead-lettered, naming the trigger."""
        if not harness.features.dead_letters_poison:
            pytest.skip("no poison-message handling")
        stream = session.stream
        healthy = session.run(max_redeliveries=2)
        poison = Script(fail={b"m1": -1})
        victim = session.run(poison, max_redeliveries=2)
        await harness.produce(stream, values(4))
        await eventually_async(lambda: harness.committed(stream), 4, what="committed")
        assert poison.failures == 3  # the first delivery and two redeliveries
        await eventually(lambda: b"m3" in victim.values(), what="the victim carries on")
        assert sorted(set(healthy.values())) == values(4)
        if harness.features.supports_dlq:
            letters = await harness.dead_letters(stream)
            assert [(d.value, d.source, d.reason, d.triggers) for d in letters] == [
                (b"m1", harness.raw_event_name(stream, 1), "max_redeliveries",
                 str(victim.trigger_id))
            ]

    async def test_a_member_away_holds_the_stream(
        self, harness: BrokerHarness, session: Session
    ) -> None:
        """A filter that failed and is backing off is still owed every later message."""
        if not harness.features.redelivers_in_session:
            pytest.skip("no redelivery within a session")
        stream = session.stream
        healthy = session.run()
        away = session.run(Script(fail={b"m1": 1}), backoff=1.5)
        await harness.produce(stream, values(2))
        await eventually(lambda: away.errors, what="the failure on m1")
        await harness.produce(stream, values(6)[2:])  # fanned out while it is away
        await eventually(lambda: set(healthy.values()) == set(values(6)),
                         what="the healthy trigger")
        committed = await harness.committed(stream)
        assert committed <= 1, f"advanced to {committed} while a member was away"
        await eventually(lambda: set(away.values()) >= set(values(6)), within=15,
                         what="the member, back, to get every message")
        await eventually_async(lambda: harness.committed(stream), 6, what="committed")

    async def test_a_slow_member_holds_the_stream_without_failing(
        self, harness: BrokerHarness
    ) -> None:
        """A filter slower than the poll is back-pressure: no overflow, nothing skipped."""
        stream = await harness.create_stream()
        session = Session(harness, stream, queue=4)
        try:
            fast, slow = session.run(), session.run(Script(delay=0.01))
            await harness.produce(stream, values(40))
            await eventually(lambda: set(slow.values()) == set(values(40)), within=20,
                             what="the slow trigger to get every message")
            await eventually_async(lambda: harness.committed(stream), 40, what="committed")
            assert slow.errors == []
            assert fast.errors == []
            assert set(fast.values()) == set(values(40))
        finally:
            await session.close()

    async def test_triggers_share_one_consumer(
        self, harness: BrokerHarness, session: Session
    ) -> None:
        """Triggers with one key share one producer: one consumer on the broker."""
        stream = session.stream
        runners = [session.run(), session.run(Script(skip={b"m0"})), session.run()]
        await harness.produce(stream, values(3))
        await eventually(lambda: all(len(r.events) >= 2 for r in runners), what="fan-out")
        await eventually_async(lambda: harness.committed(stream), 3, what="committed")
        assert harness.producers_created(stream) == 1
        members = await harness.consumers_in_group(stream)
        assert members in (None, 1)

    async def test_lossy_setting_is_refused(self, harness: BrokerHarness) -> None:
        """A setting that acknowledges before storing is refused when the trigger is built."""
        if not harness.features.refuses_lossy_settings:
            pytest.skip("nothing to refuse")
        stream = await harness.create_stream(dead_letter=False)
        with pytest.raises(ValueError, match="refused"):
            harness.lossy_trigger(stream)
