"""Settling Service Bus messages on their receivers' links; reporting what did not take.

Private to :mod:`sharedstream.producers.servicebus`. Nothing here imports
azure-servicebus: a receiver is whatever the producer got from the SDK, and
a settlement is a coroutine function the producer passes in.
:class:`Settlements` is every settlement a producer makes: completions
(the settle sender's sends), abandons and dead-letterings.

Invariants:

1. One receive or one run of settlements holds a receiver's link at a time
   (:class:`LinkTurns`): the SDK waits for a settlement's echo, and a
   receive for its messages, by polling the receiver's connection, and
   overlapping waits queue behind each other's polls.
2. :func:`settle_each` never raises for a message's own failure: it returns
   every ``(payload, error)`` that did not take, for the caller to report,
   retry or let lapse. A cancellation is raised as is.
3. Every payload :class:`Settlements` is given is counted off (its ``done``)
   exactly once: when its settlement took, failed for good, or (a
   completion) was given up after the settle sender's retries; never while
   it is to be retried.
4. A message's tally of deliveries taken (and, dead-lettered, its floor)
   is forgotten only once its settlement took: one that did not comes
   again and is judged with what was counted.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from sharedstream.brokerkit.batches import in_batches
from sharedstream.brokerkit.calls import BrokerCalls
from sharedstream.brokerkit.cancellation import cancellation_kept
from sharedstream.brokerkit.deadletters import DeadLetterDesk
from sharedstream.brokerkit.floors import LaneFloors
from sharedstream.brokerkit.redelivery import DeliveryTally
from sharedstream.engine.keyvalue_log import KeyValueLogger
from sharedstream.engine.producer import Verdict
from sharedstream.producers._servicebus_types import (
    ServiceBusPayload,
    dead_letter_details,
    first_line,
    transient,
)

__all__ = ["Disposal", "LinkTurns", "Settlements", "report_failures", "said", "settle_each"]

Failed = list[tuple[ServiceBusPayload, BaseException]]
"""The payloads whose settlement raised, with what it raised."""

Disposal = tuple[ServiceBusPayload, str, Sequence[Verdict], str]
"""A message to dead-letter, why (``rejected``, ``max_redeliveries``), who said what, and
what the producer found itself (an undecodable body; else empty)."""

_COMPLETE_LOST = ("completing messages did not take; Service Bus delivers them again and their "
                  "events are skipped as duplicates")


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
                        with cancellation_kept():  # the SDK can lose a stop's cancellation
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


class Settlements:
    """Every settlement of one producer, on its receivers' links (see the module docstring).

    ``turns`` are the producer's link turns, ``concurrency`` its
    ``settle_concurrency``; ``settled(payload)`` stops renewing a lock;
    ``done(payloads)`` counts payloads off their sessions (invariant 3);
    ``taken`` and ``floors`` are the producer's delivery tally and lane
    floors, forgotten for a message settled for good (invariant 4);
    ``letters`` its dead-letter desk; ``logger`` the producer's. Called from
    the producer's event loop. None of its methods raises for a message's
    own failure: each is reported, in one line per kind.
    """

    def __init__(self, *, entity: str, calls: BrokerCalls, turns: LinkTurns, concurrency: int,
                 settled: Callable[[ServiceBusPayload], None],
                 done: Callable[[Sequence[ServiceBusPayload]], None],
                 taken: DeliveryTally[int], floors: LaneFloors[int], letters: DeadLetterDesk,
                 logger: KeyValueLogger) -> None:
        self.entity, self._calls, self._turns, self._concurrency = entity, calls, turns, concurrency
        self._settled, self._done, self._taken, self._floors = settled, done, taken, floors
        self._letters, self._log = letters, logger

    async def _each(self, operation: str, payloads: Sequence[ServiceBusPayload],
                    settle: Callable[[ServiceBusPayload], Awaitable[None]], *,
                    in_turn: bool = False) -> Failed:
        return await settle_each(operation, payloads, settle, calls=self._calls,
                                 turns=self._turns, concurrency=self._concurrency,
                                 in_turn=in_turn)

    def _report(self, level: int, event: str,
                failed: Sequence[tuple[ServiceBusPayload, str]]) -> None:
        report_failures(self._log, level, event, self.entity, failed)

    async def complete(self, chunk: Sequence[ServiceBusPayload]) -> list[
            tuple[ServiceBusPayload, str]]:
        """Complete a chunk (the settle sender's send); returns what failed transiently.

        The sender retries what is returned. Each lock is renewed until its
        own completion leaves (a chunk of hundreds takes as many round
        trips, one after the other).
        """
        async def complete(payload: ServiceBusPayload) -> None:
            self._settled(payload)
            await payload.receiver.complete_message(payload.received)

        failed = await self._each("Complete", chunk, complete, in_turn=True)
        retry = [(p, said(exc)) for p, exc in failed if transient(exc)]
        again = {id(p) for p, _ in retry}
        refused = {id(p) for p, _ in failed}
        self._report(logging.WARNING, _COMPLETE_LOST, [
            (p, said(exc)) for p, exc in failed if id(p) not in again])
        for payload in chunk:
            if id(payload) not in refused:  # gone for good: its deliveries need no tally
                self._taken.forget(payload.message.sequence_number)
        self._done([p for p in chunk if id(p) not in again])
        return retry

    def complete_lost(self, payload: ServiceBusPayload, detail: str) -> None:
        """The settle sender gave a completion up after its retries."""
        self._report(logging.WARNING, _COMPLETE_LOST, [(payload, detail)])
        self._done([payload])

    async def abandon(self, payloads: list[ServiceBusPayload]) -> None:
        """Hand ``payloads`` back: Service Bus delivers them again at once."""
        self._log.info("abandoning messages", entity=self.entity, count=len(payloads),
                       sequence_numbers=[p.message.sequence_number for p in payloads])
        failed = await self._each(
            "Abandon", payloads, lambda p: p.receiver.abandon_message(p.received))
        self._report(logging.WARNING,
                     "abandoning messages did not take; their locks lapse and they come again",
                     [(p, said(exc)) for p, exc in failed])
        self._done(payloads)

    async def dead_letter(self, items: list[Disposal]) -> None:
        """Dead-letter ``items`` into the entity's dead-letter sub-queue.

        A dead-lettering that fails leaves the message locked until its lock
        lapses: it comes again, and is dead-lettered then.
        """
        details = {id(payload): dead_letter_details(reason, verdicts, detail)
                   for payload, reason, verdicts, detail in items}

        async def dead_letter(payload: ServiceBusPayload) -> None:
            reason, description = details[id(payload)]
            await payload.receiver.dead_letter_message(
                payload.received, reason=reason, error_description=description)

        for payload, *_ in items:
            self._settled(payload)
        failed = await self._each("DeadLetter", [p for p, *_ in items], dead_letter)
        refused = {id(p) for p, _ in failed}
        self._report(logging.ERROR, "dead-lettering messages did not take; their locks lapse, "
                     "they come again and are dead-lettered then",
                     [(p, said(exc)) for p, exc in failed])
        for payload, reason, verdicts, _ in items:
            number = payload.message.sequence_number
            if id(payload) in refused:
                continue
            self._floors.forget(payload.lane, number)
            self._taken.forget(number)
            self._letters.sent(f"{number}", f"{self.entity}/$DeadLetterQueue", reason, verdicts)
        self._done([payload for payload, *_ in items])
