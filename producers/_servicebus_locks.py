"""Renewing Service Bus message locks many to a request, on each receiver's management link.

Private to :mod:`sharedstream.producers.servicebus`. Nothing here imports
azure-servicebus: a receiver is whatever the producer got from the SDK.

The wire: Service Bus's management operation ``com.microsoft:renew-lock``
takes a map whose ``lock-tokens`` is an AMQP array of uuids and answers
``expirations``, an array of timestamps, one per token in the same order.
The answer has one status for the whole request: a token that is no
longer locked (its lock expired, its message was settled) fails all of
it with 410 ``com.microsoft:message-lock-lost`` (the SDK's
``MessageLockLostError``) without naming the token.

azure-servicebus 7.x sends exactly that request from its receiver's
private ``_renew_locks(*lock_tokens, timeout=...)`` (its public
``renew_message_lock`` passes one token): through its own management link,
the receive link named as the associated link, its own retries. After a
renewal the producer must also move each message's ``locked_until_utc``
(the SDK's private ``_expiry``, what its public call sets): the SDK refuses
to settle a message past that time itself (``MessageLockLostError``,
"the lock on the message lock has expired") without asking Service Bus.

Invariants:

1. One request carries the locks of one receiver (Service Bus resolves
   the tokens against the associated receive link), at most
   :data:`RENEW_BATCH` of them, and one request per receiver is in flight
   at a time: azure-servicebus 7.15 numbers two management requests sent
   at once on one connection out of order now and then, an AMQP session
   error (the kit's test server closes the connection for it:
   ``amqp:session:invalid-field``, "sequencing error, expected delivery-id
   2, got 1").
2. A request refused for a lost lock is split in halves, each sent again
   with only the payloads the caller still ``wanted`` (one settled
   meanwhile is dropped, never renewed), until a lost lock is alone: it is
   reported lost; the others are renewed. ``k`` lost locks among ``n`` cost
   about ``2k log2(n)`` more requests, in ``log2(n)`` rounds.
3. Without the seam (an SDK without ``_renew_locks`` or ``_expiry``, a
   call it refuses with ``TypeError``, an answer of another shape), every
   lock is renewed by the public ``renew_message_lock``, one request per
   message (as before batching: one round trip each); logged once per
   renewer.
4. :meth:`BatchedLockRenewal.renew` never raises for a lock or a request
   failing: what was renewed, lost, or not answered (to try again next
   round) is in its result. A cancellation is raised as is.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, NamedTuple

from sharedstream.brokerkit.calls import BrokerCalls
from sharedstream.brokerkit.cancellation import cancellation_kept
from sharedstream.engine.keyvalue_log import KeyValueLogger
from sharedstream.producers._servicebus_settle import said
from sharedstream.producers._servicebus_types import ServiceBusPayload

__all__ = ["RENEW_BATCH", "BatchedLockRenewal", "LockRenewal"]

RENEW_BATCH = 100
"""Lock tokens per renew-lock request at most (Service Bus documents no limit; 100 tokens
are a 2 kB request, and keep the split of a refused one short)."""


class LockRenewal(NamedTuple):
    """What one :meth:`BatchedLockRenewal.renew` did, payload by payload."""

    renewed: list[ServiceBusPayload]
    lost: list[tuple[ServiceBusPayload, str]]
    """Locks Service Bus no longer holds (expired, settled): never renewable again."""
    failed: list[tuple[ServiceBusPayload, str]]
    """Requests that were not answered (the SDK's retries spent, the link closing): these
    locks may still be held; try again."""


class BatchedLockRenewal:
    """Renews message locks, up to :data:`RENEW_BATCH` per request (see the module docstring).

    ``lock_lost`` is the SDK's ``MessageLockLostError``; ``timeout`` gives
    the seconds a request (the SDK's retries included) may take, read at
    each request. Requests are counted in ``calls`` as ``RenewLock``. All
    calls from the producer's event loop; several may run at once.
    """

    def __init__(self, *, calls: BrokerCalls, lock_lost: type[BaseException],
                 timeout: Callable[[], float | None], log: KeyValueLogger, entity: str) -> None:
        self._calls = calls
        self._lock_lost = lock_lost
        self._timeout = timeout
        self._log = log
        self._entity = entity
        self._in_flight: weakref.WeakKeyDictionary[Any, asyncio.Lock] = (
            weakref.WeakKeyDictionary())  # receiver -> its one request at a time (invariant 1)
        self.batched: bool | None = None
        """Whether requests carry many tokens: ``None`` until the first request says."""

    async def renew(self, payloads: Sequence[ServiceBusPayload],
                    wanted: Callable[[ServiceBusPayload], bool]) -> LockRenewal:
        """Renew the locks of ``payloads`` that are still ``wanted`` when their request leaves.

        Payloads of several receivers are sent per receiver, concurrently.
        """
        result = LockRenewal([], [], [])
        by_receiver: dict[int, list[ServiceBusPayload]] = {}
        for payload in payloads:
            by_receiver.setdefault(id(payload.receiver), []).append(payload)
        await asyncio.gather(*(
            self._request(group[start:start + RENEW_BATCH], wanted, result)
            for group in by_receiver.values() for start in range(0, len(group), RENEW_BATCH)))
        return result

    async def _request(self, payloads: Sequence[ServiceBusPayload],
                       wanted: Callable[[ServiceBusPayload], bool], result: LockRenewal) -> None:
        """One request for ``payloads`` (one receiver's); split in halves when a lock is lost."""
        payloads = [p for p in payloads if wanted(p)]
        if not payloads:
            return
        if self.batched is False:
            await self._each(payloads, result)
            return
        try:
            async with self._turn(payloads[0].receiver):
                payloads = [p for p in payloads if wanted(p)]  # settled while it waited?
                ends = await self._batch(payloads) if payloads else []
        except self._lock_lost as exc:
            if len(payloads) == 1:
                result.lost.append((payloads[0], said(exc)))
                return
            half = len(payloads) // 2
            await asyncio.gather(self._request(payloads[:half], wanted, result),
                                 self._request(payloads[half:], wanted, result))
            return
        # Anything else the SDK raised (its retries spent, the connection lost): the locks
        # may still be held and are tried again next round; one that lapses meanwhile comes
        # again, its events skipped as duplicates (at-least-once).
        except Exception as exc:  # noqa: BLE001
            result.failed.extend((p, said(exc)) for p in payloads)
            return
        if ends is None:  # the seam is not what it was: renew these one by one from now on
            await self._each(payloads, result)
            return
        for payload, end in zip(payloads, ends, strict=True):
            payload.received._expiry = end  # what the SDK's own renew_message_lock sets
        result.renewed.extend(payloads)

    def _turn(self, receiver: Any) -> asyncio.Lock:
        """``receiver``'s lock for management requests, made on first use."""
        lock = self._in_flight.get(receiver)
        if lock is None:
            lock = self._in_flight[receiver] = asyncio.Lock()
        return lock

    async def _batch(self, payloads: Sequence[ServiceBusPayload]) -> list[datetime] | None:
        """Send one renew-lock request; the new ends, or ``None`` if the seam is unusable."""
        receiver = payloads[0].receiver
        renew_locks = getattr(receiver, "_renew_locks", None)
        if not callable(renew_locks) or not all(hasattr(p.received, "_expiry")
                                                for p in payloads):
            self._without_seam("the SDK's receiver has no _renew_locks")
            return None
        self._calls.count("RenewLock")
        try:
            with cancellation_kept():  # the SDK can lose a stop's cancellation
                answer = await renew_locks(*(p.received.lock_token for p in payloads),
                                           timeout=self._timeout())
        except TypeError as exc:  # the private call's signature changed
            self._without_seam(f"_renew_locks refused the call ({said(exc)})")
            return None
        ends = expirations(answer, len(payloads))
        if ends is None:
            self._without_seam(f"_renew_locks answered {type(answer).__name__}, not "
                               f"{len(payloads)} expirations")
            return None
        self.batched = True
        return ends

    def _without_seam(self, why: str) -> None:
        if self.batched is not False:
            self.batched = False
            self._log.warning("renewing message locks one request per message: the SDK's "
                              "batched renewal is not usable", entity=self._entity, why=why)

    async def _each(self, payloads: Sequence[ServiceBusPayload], result: LockRenewal) -> None:
        """The public call, one request per message, all at once (invariant 3)."""
        timeout = self._timeout()
        answers: list[Any] = []
        async with self._turn(payloads[0].receiver):
            for payload in payloads:  # one at a time too: the same request, one token each
                self._calls.count("RenewLock")
                try:
                    with cancellation_kept():  # the SDK can lose a stop's cancellation
                        answers.append(await payload.receiver.renew_message_lock(
                            payload.received, timeout=timeout))
                except Exception as exc:  # noqa: BLE001 - sorted below, per message
                    answers.append(exc)
        for payload, answer in zip(payloads, answers, strict=True):
            if not isinstance(answer, Exception):
                result.renewed.append(payload)
            elif isinstance(answer, self._lock_lost):
                result.lost.append((payload, said(answer)))
            else:
                result.failed.append((payload, said(answer)))


def expirations(answer: Any, count: int) -> list[datetime] | None:
    """The ``count`` new lock ends of a renew-lock answer, or ``None`` if it has another shape.

    ``expirations`` (a bytes or text key) holds milliseconds since the
    epoch, as the SDK decodes AMQP timestamps, or datetimes.
    """
    if not isinstance(answer, Mapping):
        return None
    values = answer.get(b"expirations", answer.get("expirations"))
    if not isinstance(values, list | tuple) or len(values) != count:
        return None
    ends = []
    for value in values:
        if isinstance(value, datetime):
            ends.append(value if value.tzinfo else value.replace(tzinfo=UTC))
        elif isinstance(value, int | float) and not isinstance(value, bool):
            ends.append(datetime.fromtimestamp(value / 1000, UTC))
        else:
            return None
    return ends
