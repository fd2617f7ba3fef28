"""Service Bus: the receive loops, one for the entity or one per session, and their sessions.

Private to :mod:`sharedstream.producers.servicebus`. Nothing here imports
azure-servicebus at import time: the producer hands in its SDK loader, a
receiver factory, its call wrapper and what it does with what arrives
(:class:`Receivers`).

Invariants:

1. A receive asks for ``max_messages`` only once ``max_in_flight`` leaves
   room for them all (reserved before the call, released after it), so
   nothing is received past the limit; nothing is prefetched.
2. A receive holds its receiver's link (the producer's
   :class:`~sharedstream.producers._servicebus_settle.LinkTurns`) and
   waits :data:`GLANCE` seconds only while anything received on that link
   is unsettled, so completions never wait long behind it.
3. :attr:`Receivers.linked` is ``True`` from a receiver's opening (or a
   session accept, or Service Bus answering that no session has messages)
   while receives succeed, and ``False`` once one failed with the SDK's
   retries spent: that failure ends the poll.
4. A session receiver holds its session (its lock renewed while open)
   until a receive finds nothing and nothing it received is outstanding;
   then it lets the session go and takes the next free one. A session
   lock lost is a WARNING, not the poll's end: what was received from it
   and not settled comes again.
5. :data:`HOLLOW_LIMIT` receives in a row that return nothing at once end
   the poll (the SDK's link has shut down); the group restarts it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

from sharedstream.brokerkit.inflight import InFlightLimit
from sharedstream.brokerkit.sdk import OptionalSdk
from sharedstream.brokerkit.workers import Work
from sharedstream.engine.keyvalue_log import KeyValueLogger
from sharedstream.producers._servicebus_settle import LinkTurns
from sharedstream.producers._servicebus_types import (
    ServiceBusProducerError,
    ServiceBusRequestError,
    ServiceBusSettings,
)

__all__ = ["GLANCE", "HOLLOW_LIMIT", "Receivers"]

GLANCE = 0.05
"""Seconds a receive waits while settlements may be queued behind it (invariant 2)."""
HOLLOW_LIMIT = 3
"""Receives in a row that return nothing in under half their wait before the poll ends.

The SDK's receiver returns at once, empty, forever once its link has shut
down (7.15 shuts it down on a message it cannot decode, see
:func:`~sharedstream.producers._servicebus_received.guard_sdk_decoder`),
without ever yielding to the event loop: a loop receiving again and again
would hold the event loop, signals included. A healthy empty receive waits
its whole wait.
"""

Call = Callable[[str, Callable[[], Awaitable[Any]]], Awaitable[Any]]
"""The producer's SDK call: ``call(operation, request)``, counted, its errors wrapped."""
Take = Callable[[Any, str | None, list[Any]], Awaitable[None]]
"""What the producer does with a receive's messages: ``take(receiver, session, received)``."""


class Receivers:
    """The receive loops of one producer (see the module docstring).

    ``receiver(session=...)`` makes a peek-lock receiver of the entity (of
    the next free session); ``close(what, close)`` closes an SDK handle,
    bounded. ``outstanding`` is the producer's count of unsettled messages
    per session receiver (by ``id``): set here when a session is taken,
    counted up by ``take``, down by the producer as they settle.
    ``unsettled()`` says whether anything received without sessions is
    unsettled; ``lock()`` is the message lock renewals are planned on, in
    seconds. Runs on the producer's event loop; each loop is one worker of
    its poll.
    """

    def __init__(self, settings: ServiceBusSettings, *, entity: str, sdk: OptionalSdk,
                 call: Call, receiver: Callable[..., Any],
                 close: Callable[[str, Callable[[], Awaitable[None]]], Awaitable[None]],
                 take: Take, in_flight: InFlightLimit, turns: LinkTurns,
                 outstanding: dict[int, int], unsettled: Callable[[], bool],
                 lock: Callable[[], float], logger: KeyValueLogger) -> None:
        self.settings, self.entity, self._sdk, self._call = settings, entity, sdk, call
        self._receiver, self._close, self._take = receiver, close, take
        self._in_flight, self._turns, self._open = in_flight, turns, outstanding
        self._unsettled, self._lock, self._log = unsettled, lock, logger
        self.linked = False
        """A receiver is open and its last receive succeeded (invariant 3)."""

    async def open(self, exits: contextlib.AsyncExitStack) -> list[tuple[str, Work]]:
        """The receive workers: one per session up to ``max_sessions``, else one receiver.

        Without sessions the receiver is opened here (raising the wrapped
        SDK error when it cannot be) and closed by ``exits``.
        """
        s = self.settings
        if s.sessions:
            return [(f"session-{n}", self._session_loop) for n in range(s.max_sessions)]
        receiver = self._receiver(session=False)
        await self._call("OpenReceiver", receiver.__aenter__)
        exits.push_async_callback(self._close, "receiver", receiver.close)
        self.linked = True
        return [("receive", lambda: self._receive_loop(receiver, None))]

    async def _receive_loop(self, receiver: Any, session: str | None) -> None:
        """Receive while ``max_in_flight`` leaves room; with a session, until it is idle.

        Returns (a session only) once a receive found nothing and nothing
        received from the session is outstanding.
        """
        s, in_flight = self.settings, self._in_flight
        clock, hollow = asyncio.get_running_loop().time, 0
        while True:
            await in_flight.room(s.max_messages)
            in_flight.take(s.max_messages)  # reserve room for a full receive
            # Completions wait for the link while a receive holds it: with anything received
            # and unsettled, only a glance; else max_wait_time, at most a quarter of a lock.
            busy = (self._open.get(id(receiver)) if session is not None
                    else self._unsettled())
            wait = GLANCE if busy else min(s.max_wait_time, self._lock() / 4)
            started = clock()
            try:
                async with self._turns.lock(receiver):
                    received = await self._call("Receive", functools.partial(
                        receiver.receive_messages, max_message_count=s.max_messages,
                        max_wait_time=wait))
            except ServiceBusProducerError:
                self.linked = False  # the SDK's retries are spent: the poll ends
                raise
            finally:
                in_flight.release(s.max_messages)
            hollow = 0 if received or clock() - started >= wait / 2 else hollow + 1
            if hollow >= HOLLOW_LIMIT:
                self.linked = False
                raise ServiceBusRequestError(
                    f"Receive on {self.entity} returned nothing at once {hollow} times in a row: "
                    "the SDK's receive link has shut down; the poll restarts")
            self.linked = True
            in_flight.take(len(received))
            if received:
                await self._take(receiver, session, received)
            elif session is not None and not self._open.get(id(receiver)):
                return

    async def _session_loop(self) -> None:
        """Take the next free session, receive it until idle, let it go; forever."""
        servicebus_exceptions = self._sdk("azure.servicebus.exceptions")
        while True:
            receiver = self._receiver(session=True)
            try:
                await self._call("AcceptSession", receiver.__aenter__)
            except ServiceBusProducerError as exc:
                await self._close("session receiver", receiver.close)
                if isinstance(exc.__cause__, servicebus_exceptions.OperationTimeoutError):
                    self.linked = True  # Service Bus answered: no session has messages now
                    continue  # ask again
                self.linked = False
                raise
            self.linked = True
            session = str(receiver.session.session_id)
            self._open[id(receiver)] = 0
            try:
                async with asyncio.TaskGroup() as tasks:
                    renewer = tasks.create_task(self._keep_session(receiver),
                                                name=f"servicebus {self.entity} session {session}")
                    await self._receive_loop(receiver, session)
                    renewer.cancel()
            except BaseExceptionGroup as group:
                lost = servicebus_exceptions.SessionLockLostError
                other = [e for e in group.exceptions if not isinstance(e.__cause__, lost)]
                if other:
                    raise other[0]  # noqa: B904 - its own cause is the SDK's error
                self._log.warning("lost a session lock; what was received from it and not "
                                  "settled comes again", entity=self.entity, session=session)
            finally:
                self._open.pop(id(receiver), None)
                self._turns.drop(receiver)
                await self._close("session receiver", receiver.close)

    async def _keep_session(self, receiver: Any) -> None:
        """Renew the session's lock once half of what is left of it has passed, while open.

        Planned on the lock the session shows (``locked_until_utc``), never
        on more than ``lock_duration``.
        """
        while True:
            left = float(self._lock())
            until = receiver.session.locked_until_utc
            if until is not None:
                left = min(left, (until - datetime.now(UTC)).total_seconds())
            await asyncio.sleep(max(0.2, left / 2))
            await self._call("RenewSessionLock", receiver.session.renew_lock)
