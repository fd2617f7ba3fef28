"""Message locks held across a real network's round trip: a slow, healthy watcher loses none.

The producer reaches the kit's test server through the kit's latency proxy
(:mod:`sharedstream.testing.latency_proxy`), 15 ms each way (a 30 ms round
trip: Azure from many of the machines that call it). One watcher takes
every message and spends long enough on each that the last ones wait in
its queue for more than a lock: each lock must be renewed, some several
times, while receives and completions go on. Counted at the server: locks
that lapsed (each one a redelivery) and messages dead-lettered; both must
be zero. With locks renewed one request per message, in turns with
receives and completions, 600 messages and 10 s locks at 30 ms gave 2,163
lapses and 274 messages dead-lettered as ``max_redeliveries``, though no
watcher ever failed (docs/servicebus.md#locks has the table).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

pytest.importorskip("azure.servicebus")
pytest.importorskip("proton")

import azure.servicebus
from azure.servicebus import ServiceBusMessage
from azure.servicebus.aio import ServiceBusClient
from azure.servicebus.exceptions import MessageLockLostError

from sharedstream.brokerkit.calls import BrokerCalls
from sharedstream.engine.events import TriggerEvent
from sharedstream.engine.keyvalue_log import key_value_logger
from sharedstream.engine.manager import SharedStreamManager
from sharedstream.producers._servicebus_locks import BatchedLockRenewal
from sharedstream.producers.servicebus import ServiceBusMessage as FilteredMessage
from sharedstream.producers.servicebus import ServiceBusPayload
from sharedstream.testing.conformance import unique_ids
from sharedstream.testing.harness import Stream
from sharedstream.testing.latency_proxy import latency_proxy
from sharedstream.testing.runner import SupervisedRunner, eventually
from sharedstream.testing.scripts import SCRIPTS, Script
from sharedstream.testing.servicebus.model import EntitySettings
from sharedstream.testing.servicebus.server import connection_string
from sharedstream.triggers.servicebus import ServiceBusSharedStreamTrigger
from tests.servicebus.harness import (
    ConformanceServiceBusTrigger,
    ServiceBusHarness,
    ThreadedServiceBusServer,
)

ONE_WAY = 0.015
"""Seconds each way through the proxy: a 30 ms round trip."""
LOCKS = (5, 10, 30)
SHORT_LOCK = 2
"""The lock of the ``lock-2s`` queue: shorter than any lock_duration a trigger takes."""


@pytest.fixture(scope="module")
def far_server() -> Iterator[tuple[ThreadedServiceBusServer, str]]:
    """The test server with one queue per lock of :data:`LOCKS`, and a connection string
    that reaches it through the latency proxy."""
    server = ThreadedServiceBusServer()
    for lock in (*LOCKS, SHORT_LOCK):
        # Service Bus's own limit well above ours: max_redeliveries alone decides.
        server.state.create_queue(f"lock-{lock}s", EntitySettings(
            lock_duration=lock, max_delivery_count=100))
    server.start()
    try:
        with latency_proxy("127.0.0.1", server.port, delay=ONE_WAY, jitter=0.002,
                           seed=29) as proxy:
            yield server, connection_string(proxy.host, proxy.port)
    finally:
        server.stop()


async def watch_slowly(far: tuple[ThreadedServiceBusServer, str], *, messages: int,
                       lock: int, per_message: float) -> tuple[int, int, int]:
    """Send ``messages``, let one watcher spend ``per_message`` on each; when all are done:
    ``(locks lapsed, dead-lettered, deliveries the watcher saw)``."""
    server, via = far
    queue = f"lock-{lock}s"
    harness = ServiceBusHarness(server, sessions=False, via=via)
    stream = Stream(name=queue, dead_letter=f"{queue}/$DeadLetterQueue", group="")
    before = server.state.lock_counts(queue)
    await harness.start()
    manager = SharedStreamManager(ack_timeout=600.0, max_subscriber_queue=2 * messages)
    script = f"slow-{next(unique_ids)}"
    SCRIPTS[script] = Script(delay=per_message)
    runner = SupervisedRunner(manager, ConformanceServiceBusTrigger(
        script=script, **harness.trigger_kwargs(stream, lock_duration=lock)), next(unique_ids))
    try:
        async with harness.client.get_queue_sender(queue, keep_alive=None) as sender:
            for start in range(0, messages, 200):
                await sender.send_messages([ServiceBusMessage(f"m{n}")
                                            for n in range(start, min(start + 200, messages))])
        harness.sent[queue] = messages
        runner.start()
        started = time.monotonic()
        await eventually(lambda: server.unsettled(queue) == 0,
                         within=messages * per_message * 2 + 60, what="every message settled")
        took = time.monotonic() - started
        letters = await harness.dead_letters(stream)
        after = server.state.lock_counts(queue)
        lapsed = after.lapsed - before.lapsed
        print(f"\n{messages} messages, {lock} s lock, {2 * ONE_WAY * 1000:.0f} ms RTT: "
              f"{lapsed} lapsed, {len(letters)} dead-lettered, {len(runner.events)} deliveries "
              f"seen, {after.renewed - before.renewed} locks renewed in "
              f"{after.renew_requests - before.renew_requests} requests, {took:.1f} s")
        return lapsed, len(letters), len(runner.events)
    finally:
        await runner.stop()
        await manager.stop_all()
        await harness.close()


@pytest.mark.slow  # about 18 s behind the latency proxy: the slow CI step
async def test_a_slow_healthy_watcher_loses_no_lock_at_30_ms(
    far_server: tuple[ThreadedServiceBusServer, str],
) -> None:
    """300 messages, 5 s locks, 35 ms each: the last waits 10 s, two locks' worth."""
    lapsed, dead, seen = await watch_slowly(far_server, messages=300, lock=5, per_message=0.035)
    assert (lapsed, dead, seen) == (0, 0, 300)


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize(("messages", "lock", "per_message"), [
    (600, 10, 0.035),  # 21 s of work: the last message's lock renewed twice
    (1000, 30, 0.045),  # 45 s of work
], ids=["600-10s", "1000-30s"])
async def test_the_issue_s_table_at_30_ms(
    far_server: tuple[ThreadedServiceBusServer, str], messages: int, lock: int,
    per_message: float,
) -> None:
    """The figures of issue 29 at 30 ms: no lapse, no dead letter, each message seen once."""
    result: Any = await watch_slowly(far_server, messages=messages, lock=lock,
                                     per_message=per_message)
    assert result == (0, 0, messages)


class _SlowOnFirstDelivery(ServiceBusSharedStreamTrigger):
    """Spends 8 s on a message's first delivery, none on a redelivery."""

    async def filter_shared_stream(
        self, shared_stream: AsyncIterator[Any],
    ) -> AsyncIterator[TriggerEvent]:
        async for message in shared_stream:
            if message.delivery_count == 0:
                await asyncio.sleep(8)
            yield TriggerEvent({"delivery_count": message.delivery_count})


@pytest.mark.slow  # over 6 s: the slow CI step (keeps the default run under 15 minutes)
async def test_a_lapse_nobody_failed_on_is_not_counted_toward_dead_lettering(
    far_server: tuple[ThreadedServiceBusServer, str],
) -> None:
    """``max_redeliveries=0``, and a lock that lapses while its watcher is still on it.

    Renewal stops at ``max_lock_renewal`` (5 s) and the 2 s lock lapses
    while the watcher works (8 s): Service Bus delivers the message again
    with delivery count 1. Nobody failed on it, so it is fanned out and
    completed, not dead-lettered as one failure too many (which it was,
    counted by delivery count alone).
    """
    server, _ = far_server
    queue = f"lock-{SHORT_LOCK}s"
    harness = ServiceBusHarness(server, sessions=False)
    await harness.start()
    stream = Stream(name=queue, dead_letter=f"{queue}/$DeadLetterQueue", group="")
    lapsed = server.state.lock_counts(queue).lapsed
    manager = SharedStreamManager(ack_timeout=30.0)
    runner = SupervisedRunner(manager, _SlowOnFirstDelivery(
        connection_string=server.connection_string, queue=queue, lock_duration=5,
        max_lock_renewal=5, max_redeliveries=0, max_wait_time=0.5), next(unique_ids)).start()
    try:
        await harness.produce(stream, [b"slow"])
        await eventually(lambda: len(runner.events) == 2, within=20, what="both deliveries")
        await eventually(lambda: server.unsettled(queue) == 0, within=10, what="completed")
        assert sorted(e.payload["delivery_count"] for e in runner.events) == [0, 1]
        assert server.state.lock_counts(queue).lapsed == lapsed + 1
        assert await harness.dead_letters(stream) == []
    finally:
        await runner.stop()
        await manager.stop_all()
        await harness.close()


async def test_the_sdk_seam_of_batched_renewal_does_what_the_producer_relies_on(
    far_server: tuple[ThreadedServiceBusServer, str],
) -> None:
    """Pins the installed azure-servicebus's private seam (7.15 when written).

    ``receiver._renew_locks(*tokens, timeout=...)`` sends one renew-lock
    request for all its tokens and answers an expiration for each; setting
    a message's ``_expiry`` is what moves its ``locked_until_utc``, which
    the SDK checks itself before it settles. So three locks renewed in one
    request complete after their first lock (2 s) ended. Should an SDK
    upgrade break this, the producer falls back to ``renew_message_lock``
    per message (``batched`` false, one warning): this test then says so.
    """
    server, _ = far_server
    queue = f"lock-{SHORT_LOCK}s"
    async with ServiceBusClient.from_connection_string(server.connection_string) as client:
        async with client.get_queue_sender(queue, keep_alive=None) as sender:
            await sender.send_messages([ServiceBusMessage(f"pin{n}") for n in range(3)])
        async with client.get_queue_receiver(queue, prefetch_count=0, keep_alive=None) as receiver:
            received = await receiver.receive_messages(max_message_count=3, max_wait_time=5)
            assert len(received) == 3
            first_ends = [m.locked_until_utc for m in received]
            before = server.state.lock_counts(queue)
            await asyncio.sleep(1.0)
            renewal = BatchedLockRenewal(
                calls=BrokerCalls("servicebus"), lock_lost=MessageLockLostError,
                timeout=lambda: 5.0, log=key_value_logger(__name__), entity=queue)
            payloads = [ServiceBusPayload(("message", n), FilteredMessage(
                queue, sequence_number=n, body=b""), m, receiver)
                for n, m in enumerate(received)]
            result = await renewal.renew(payloads, wanted=lambda _: True)
            after = server.state.lock_counts(queue)
            version = azure.servicebus.__version__
            assert renewal.batched, f"azure-servicebus {version}: the batched seam is gone"
            assert (result.renewed, result.lost, result.failed) == (payloads, [], [])
            assert (after.renew_requests - before.renew_requests,
                    after.renewed - before.renewed) == (1, 3), "one request, three locks"
            assert all(m.locked_until_utc is not None and end is not None
                       and m.locked_until_utc > end
                       for m, end in zip(received, first_ends, strict=True))
            await asyncio.sleep(SHORT_LOCK - 0.5)  # past the first lock: renewed, or lost
            for message in received:
                await receiver.complete_message(message)
    assert server.state.lock_counts(queue).lapsed == after.lapsed
