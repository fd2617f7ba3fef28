"""Settling Service Bus messages on their receivers' links; reporting what did not take.

Private to :mod:`sharedstream.producers.servicebus`. Nothing here imports
azure-servicebus: a receiver is whatever the producer got from the SDK, and
a settlement is a coroutine function the producer passes in.

Invariants:

1. One receive or one run of settlements holds a receiver's link at a time
   (:class:`LinkTurns`): the SDK waits for a settlement's echo, and a
   receive for its messages, by polling the receiver's connection, and
   overlapping waits queue behind each other's polls.
2. :func:`settle_each` never raises for a message's own failure: it returns
   every ``(payload, error)`` that did not take, for the caller to report,
   retry or let lapse. A cancellation is raised as is.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from sharedstream.brokerkit.batches import in_batches
from sharedstream.brokerkit.calls import BrokerCalls
from sharedstream.engine.keyvalue_log import KeyValueLogger
from sharedstream.producers._servicebus_types import ServiceBusPayload, first_line

__all__ = ["LinkTurns", "report_failures", "said", "settle_each"]

Failed = list[tuple[ServiceBusPayload, BaseException]]
"""The payloads whose settlement raised, with what it raised."""


class LinkTurns:
    """The lock of each receiver's link: one receive or one run of settlements at a time.

    A completion behind a pending receive took ~100 ms instead of 0.3 ms
    on the test server: taking turns is much faster. ``asyncio.Lock`` is
    fair, so receiving and settling alternate under load. One event loop
    only, as every asyncio lock.
    """

    def __init__(self) -> None:
        self._locks: dict[int, asyncio.Lock] = {}  # id(receiver) -> its link's turn

    def lock(self, receiver: Any) -> asyncio.Lock:
        """``receiver``'s lock, made on first use."""
        lock = self._locks.get(id(receiver))
        if lock is None:
            lock = self._locks[id(receiver)] = asyncio.Lock()
        return lock

    def drop(self, receiver: Any) -> None:
        """Forget ``receiver`` (it is closing); a no-op for one never locked."""
        self._locks.pop(id(receiver), None)


async def settle_each(
    operation: str,
    payloads: Sequence[ServiceBusPayload],
    settle: Callable[[ServiceBusPayload], Awaitable[None]],
    *,
    calls: BrokerCalls,
    turns: LinkTurns,
    concurrency: int,
    in_turn: bool = False,
) -> Failed:
    """Settle each payload, counted as ``operation`` in ``calls``; the ones that raised.

    ``in_turn`` (completions: the volume): one at a time per
    receiver, holding its link. Otherwise (abandons and dead-letterings:
    rare) ``concurrency`` at a time while a receive may be pending: a
    message handed back must go to that receive, in the session's order,
    not arrive between two receives.
    """
    calls.count(operation, len(payloads))
    failed: Failed = []
    if in_turn:
        by_receiver: dict[int, list[ServiceBusPayload]] = {}
        for payload in payloads:
            by_receiver.setdefault(id(payload.receiver), []).append(payload)
        for group in by_receiver.values():
            async with turns.lock(group[0].receiver):
                for payload in group:
                    try:
                        await settle(payload)
                    except Exception as exc:  # noqa: BLE001 - the caller reports them
                        failed.append((payload, exc))
        return failed

    async def chunk(part: Sequence[ServiceBusPayload]) -> None:
        results = await asyncio.gather(*(settle(p) for p in part), return_exceptions=True)
        for payload, result in zip(part, results, strict=True):
            if isinstance(result, BaseException):
                if not isinstance(result, Exception):
                    raise result  # a cancellation
                failed.append((payload, result))

    await in_batches(payloads, chunk, size=concurrency, concurrency=1)
    return failed


def report_failures(log: KeyValueLogger, level: int, event: str, entity: str,
                    failed: Sequence[tuple[ServiceBusPayload, str]]) -> None:
    """Log failed settlements as one ``event`` line: sequence numbers and the first reason.

    After an outage they fail in hundreds, and a line per message would say
    the same thing each time. Nothing is logged for none.
    """
    if not failed:
        return
    numbers = [p.message.sequence_number for p, _ in failed]
    reasons = {detail for _, detail in failed}
    log.log(level, event, entity=entity, count=len(failed), sequence_numbers=numbers[:10],
            error=failed[0][1], other_errors=len(reasons) - 1)


def said(exc: BaseException) -> str:
    """``Type: first line`` of an error (the type alone when it says nothing), for a log line."""
    kind = type(exc).__name__
    return f"{kind}: {first_line(exc, 200)}" if str(exc).strip() else kind
