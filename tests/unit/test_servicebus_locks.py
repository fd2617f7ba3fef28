"""Batched lock renewal against fake receivers: one request per batch, lost locks found alone.

The fake receiver answers ``_renew_locks`` as Service Bus answers
``com.microsoft:renew-lock``: an expiration per token, or a lock-lost
error for the whole request when one token is gone. The real SDK's seam is
pinned against the test server in ``tests/servicebus/test_lock_latency.py``.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

from sharedstream.brokerkit.calls import BrokerCalls
from sharedstream.engine.keyvalue_log import key_value_logger
from sharedstream.producers._servicebus_locks import (
    RENEW_BATCH,
    BatchedLockRenewal,
    expirations,
)
from sharedstream.producers._servicebus_types import ServiceBusMessage, ServiceBusPayload

END = 1_800_000_000_000  # ms since the epoch: what the fake answers for every lock


class LockLost(Exception):
    """The SDK's MessageLockLostError, in these tests."""


class Received:
    """The SDK's received message, as far as renewal touches it."""

    def __init__(self, token: str) -> None:
        self.lock_token = token
        self._expiry: datetime | None = None


class Receiver:
    """Answers renew-lock requests; records them and how many ran at once."""

    def __init__(self, lost: set[str] | None = None) -> None:
        self.lost = lost or set()
        self.requests: list[list[str]] = []
        self.running = self.most_running = 0
        self.fail_with: Exception | None = None

    async def _renew_locks(self, *tokens: str,
                           timeout: float | None = None) -> Any:  # noqa: ASYNC109 - the SDK's
        self.requests.append(list(tokens))
        self.running += 1
        self.most_running = max(self.most_running, self.running)
        try:
            await asyncio.sleep(0.001)
            if self.fail_with is not None:
                raise self.fail_with
            if self.lost.intersection(tokens):
                raise LockLost("The lock supplied is invalid.")
            return {b"expirations": [END] * len(tokens)}
        finally:
            self.running -= 1


class OldReceiver:
    """A receiver of an SDK without the batched seam: the public call only."""

    def __init__(self, lost: set[str]) -> None:
        self.lost = lost
        self.renewed: list[str] = []

    async def renew_message_lock(self, message: Received, *,
                                 timeout: float | None) -> datetime:  # noqa: ASYNC109 - ditto
        if message.lock_token in self.lost:
            raise LockLost("lost")
        self.renewed.append(message.lock_token)
        return datetime.now(UTC)


def payloads(receiver: object, count: int, start: int = 0) -> list[ServiceBusPayload]:
    return [ServiceBusPayload(("message", n), ServiceBusMessage("q", sequence_number=n, body=b""),
                              Received(f"t{n}"), receiver) for n in range(start, start + count)]


def renewal(calls: BrokerCalls | None = None) -> BatchedLockRenewal:
    calls = BrokerCalls("servicebus") if calls is None else calls
    return BatchedLockRenewal(calls=calls, lock_lost=LockLost,
                              timeout=lambda: 5.0, log=key_value_logger(__name__), entity="q")


def tokens(items: list[ServiceBusPayload]) -> list[str]:
    return [p.received.lock_token for p in items]


async def test_a_batch_is_one_request_and_every_message_shows_its_new_lock() -> None:
    receiver, calls = Receiver(), BrokerCalls("servicebus")
    batch = payloads(receiver, 5)
    result = await renewal(calls).renew(batch, wanted=lambda _: True)
    assert receiver.requests == [tokens(batch)]
    assert (result.renewed, result.lost, result.failed) == (batch, [], [])
    assert {p.received._expiry for p in batch} == {datetime.fromtimestamp(END / 1000, UTC)}
    assert calls["RenewLock"] == 1


async def test_a_lost_lock_is_found_by_halving_and_the_others_are_renewed() -> None:
    receiver = Receiver(lost={"t5"})
    batch = payloads(receiver, 8)
    result = await renewal().renew(batch, wanted=lambda _: True)
    assert [p.received.lock_token for p, _ in result.lost] == ["t5"]
    assert "invalid" in result.lost[0][1]
    assert sorted(tokens(result.renewed)) == sorted(set(tokens(batch)) - {"t5"})
    # 8 -> 4 + 4 -> (2 + 2) -> (1 + 1): log2(8) rounds, 7 requests in all
    assert len(receiver.requests) == 7


async def test_what_is_no_longer_wanted_is_left_out_of_the_split() -> None:
    receiver = Receiver(lost={"t1"})
    batch = payloads(receiver, 4)
    settled: set[str] = set()
    renew = renewal()

    def wanted(payload: ServiceBusPayload) -> bool:
        return payload.received.lock_token not in settled

    async def settle_t1_meanwhile() -> None:
        await asyncio.sleep(0)  # once the first request has left
        settled.add("t1")

    result, _ = await asyncio.gather(renew.renew(batch, wanted), settle_t1_meanwhile())
    assert (result.lost, tokens(result.renewed)) == ([], ["t0", "t2", "t3"])
    assert all("t1" not in request for request in receiver.requests[1:])


async def test_one_request_per_receiver_at_a_time_and_receivers_apart() -> None:
    """The SDK misnumbers management requests sent at once on one connection."""
    first, second = Receiver(), Receiver()
    batch = payloads(first, 2 * RENEW_BATCH + 1) + payloads(second, 3, start=1000)
    result = await renewal().renew(batch, wanted=lambda _: True)
    assert len(result.renewed) == len(batch)
    assert [len(r) for r in first.requests] == [RENEW_BATCH, RENEW_BATCH, 1]
    assert first.most_running == 1
    assert second.requests == [tokens(batch[-3:])]


async def test_a_request_that_fails_otherwise_is_neither_renewed_nor_lost() -> None:
    receiver = Receiver()
    receiver.fail_with = RuntimeError("connection lost")
    batch = payloads(receiver, 3)
    result = await renewal().renew(batch, wanted=lambda _: True)
    assert (result.renewed, result.lost) == ([], [])
    assert [(p, detail) for p, detail in result.failed] == [
        (p, "RuntimeError: connection lost") for p in batch]


async def test_without_the_seam_each_message_is_renewed_by_the_public_call() -> None:
    receiver, calls = OldReceiver(lost={"t2"}), BrokerCalls("servicebus")
    batch = payloads(receiver, 4)
    renew = renewal(calls)
    result = await renew.renew(batch, wanted=lambda _: True)
    assert renew.batched is False
    assert receiver.renewed == ["t0", "t1", "t3"]
    assert [p.received.lock_token for p, _ in result.lost] == ["t2"]
    assert calls["RenewLock"] == 4


def test_an_answer_of_another_shape_is_not_taken_for_expirations() -> None:
    when = datetime(2030, 1, 1, tzinfo=UTC)
    assert expirations({"expirations": [when, when.replace(tzinfo=None)]}, 2) == [when, when]
    assert expirations({b"expirations": [1000]}, 2) is None
    assert expirations({b"expirations": ["soon"]}, 1) is None
    assert expirations([1000], 1) is None
