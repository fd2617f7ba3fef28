"""Azure Service Bus: one peek-lock receiver shared by every trigger of an entity (ack mode).

:class:`ServiceBusSharedStreamProducer` receives from a queue or a topic
subscription with ``azure.servicebus.aio`` (the ``servicebus`` extra:
``pip install 'sharedstream[servicebus]'``) in peek-lock mode and maps each
advanced outcome to a settlement:

* **clean** (acked, nobody failed or rejected) - complete it. Completions
  are queued and sent by the kit's settle sender, in turns of the
  receiver's link; ``advance`` returns once they are queued (the events are
  already stored: a crash before the completion only redelivers the
  message, and the store skips its events).
* **rejected** - dead-letter it (Service Bus's own dead-letter sub-queue,
  ``<entity>/$DeadLetterQueue``) with the reason ``sharedstream.rejected``
  and a description naming the triggers and what they said.
* **failed** - abandon it: Service Bus delivers it again at once and its
  delivery count grows; once it has failed more than ``max_redeliveries``
  times it is dead-lettered instead (``sharedstream.max_redeliveries``). A
  message that arrives already delivered that often without resolving
  (crashes, lapsed locks) is dead-lettered without being fanned out; the
  deliveries this process took itself and that ended in none of the
  message's own failures (a lapsed lock, a completion that did not take)
  are not counted (see :meth:`ServiceBusSharedStreamProducer._take`).
* **fanned out to nobody** - left alone: its lock is not renewed and lapses,
  and Service Bus delivers it again.

While a message waits for its subscribers and for its events to be stored,
and then for its completion to be sent, its lock is renewed up to
``max_lock_renewal`` seconds after it arrived: many locks to one
management request (:mod:`~sharedstream.producers._servicebus_locks`),
once half of the lock has passed or, on a slow network, once only a few
observed round trips of that request are left, whichever comes first.
Renewals do not wait for a receive or a completion to give the link up.
A lock that is lost anyway (the entity's lock is shorter than planned, a
long outage) only means Service Bus delivers the message again: its events
are stored under ``<entity>/<sequence number>`` and the store skips them
as duplicates, never a loss.

**Lanes.** On an entity without sessions each message is its own lane: one
slow message holds back nothing else. On a session-enabled entity
(``sessions=True``) the lane is the session: up to ``max_sessions``
sessions are received at once, each by its own receiver holding the
session's lock (renewed while it is open), order is kept within a session,
and a failed message holds its session: the session's later messages are
abandoned behind it, uncounted, so they come again after it, in order. A
receiver lets its session go once a receive finds nothing and nothing it
received is outstanding.

**Back-pressure.** Receiving pauses while ``max_in_flight`` messages are
received and not yet advanced; nothing is prefetched beyond what a receive
call asks for (a prefetched message's lock would tick unseen).

Two triggers with different consumer settings on one entity would be two
competing receivers, each message reaching only one of them: a second
producer for an entity already consumed in this process with other
settings is refused (:class:`ServiceBusConfigError`).

The plumbing is the broker kit's (:mod:`sharedstream.brokerkit`); what is
here is Service Bus's: the client, receivers and sessions, settlements and
lock renewal.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, TypeVar

from sharedstream.brokerkit.calls import BrokerCalls
from sharedstream.brokerkit.deadletters import (
    REASON_MAX_REDELIVERIES,
    REASON_REJECTED,
    DeadLetterDesk,
)
from sharedstream.brokerkit.fingerprints import SourceClaims
from sharedstream.brokerkit.floors import AGAIN, BOUNCE, POISON, REJECTED, SETTLE, LaneFloors
from sharedstream.brokerkit.inflight import InFlightLimit
from sharedstream.brokerkit.lease import LeaseKeeper
from sharedstream.brokerkit.message_identity import message_fingerprint
from sharedstream.brokerkit.redelivery import DeliveryTally, PoisonCheck, RedeliveryPolicy
from sharedstream.brokerkit.sdk import OptionalSdk
from sharedstream.brokerkit.settle import SettleSender
from sharedstream.brokerkit.workers import PollWorkers
from sharedstream.engine.keyvalue_log import key_value_logger
from sharedstream.engine.producer import (
    AdvanceItem,
    BrokerBacklog,
    DeadLetter,
    SharedStreamProducer,
    Verdict,
)
from sharedstream.engine.tracing import carrier_of
from sharedstream.producers._servicebus_backlog import entity_backlog
from sharedstream.producers._servicebus_locks import RENEW_BATCH, BatchedLockRenewal
from sharedstream.producers._servicebus_received import (
    UndecodableBodyError,
    guard_sdk_decoder,
    read_message,
)
from sharedstream.producers._servicebus_republish import (
    ServiceBusRepublishError,
    republish_messages,
)
from sharedstream.producers._servicebus_settle import (
    LinkTurns,
    report_failures,
    said,
    settle_each,
)
from sharedstream.producers._servicebus_types import (
    ServiceBusConfigError,
    ServiceBusMessage,
    ServiceBusPayload,
    ServiceBusProducerError,
    ServiceBusRequestError,
    ServiceBusSettings,
    dead_letter_details,
    namespace_of,
    open_client,
    receiver_options,
    sdk_error,
    transient,
)

__all__ = [
    "ServiceBusConfigError",
    "ServiceBusMessage",
    "ServiceBusPayload",
    "ServiceBusProducerError",
    "ServiceBusRepublishError",
    "ServiceBusRequestError",
    "ServiceBusSettings",
    "ServiceBusSharedStreamProducer",
    "namespace_of",
]

log = key_value_logger(__name__)

# The SDK logs every AMQP error it meets at INFO (a missing entity, each retried failure), and
# the producer reports each one itself, wrapped and once; so the SDK's loggers, when nobody set
# their level, show WARNING and up only (set "azure.servicebus" to DEBUG to see its chatter).
_sdk_logger = logging.getLogger("azure.servicebus")
if _sdk_logger.level == logging.NOTSET:
    _sdk_logger.setLevel(logging.WARNING)

_T = TypeVar("_T")
_COMPLETE_LOST = ("completing messages did not take; Service Bus delivers them again and their "
                  "events are skipped as duplicates")
_MAX_HOLDS = 4096
_GLANCE = 0.05
"""Seconds a receive waits while settlements may be queued behind it (see _receive_loop)."""
_COMPLETE_TURN = 500
"""Completions sent in one turn of a receiver's link at most."""
_RENEW_CONCURRENCY = 4
"""Renew-lock requests in flight at once (each up to ``RENEW_BATCH`` locks of one receiver)."""
_MARGIN_ROUND_TRIPS = 4
"""A lock is renewed once no more than this many observed renewal round trips are left of it
(or half of it, whichever is sooner): a request that takes long is started early enough."""
_HOLLOW_LIMIT = 3
"""Receives in a row that return nothing in under half their wait before the poll ends.

The SDK's receiver returns at once, empty, forever once its link has shut
down (7.15 shuts it down on a message it cannot decode, see
:func:`guard_sdk_decoder`), without ever yielding to the event loop: a
loop receiving again and again would hold the event loop, signals
included. A healthy empty receive waits its whole wait.
"""
CLOSE_TIMEOUT = 5.0
"""Seconds one SDK close (a receiver, the client) may take before it is given up.

azure-servicebus 7.15 can wait forever in a receiver's close: with
``prefetch_count=0`` it always runs a keep-alive task, and a close that
meets an open still in flight on the same handler (a session accept cut
short by a stop) waits on a keep-alive the open restarted. Past this bound
the close is cancelled, which cancels that task too; the client's close
then ends the connection. Nothing is lost either way: what was not settled
comes again when its lock lapses.
"""

_sdk = OptionalSdk(broker="Service Bus", package="azure.servicebus", extra="servicebus",
                   error=ServiceBusConfigError)

_Disposal = tuple[ServiceBusPayload, str, Sequence[Verdict], str]
"""A message to dead-letter, why (``rejected``, ``max_redeliveries``), who said what, and
what the producer found itself (an undecodable body; else empty)."""

_consumed = SourceClaims()
"""Entities consumed in this process, and the settings fingerprint consuming each."""


class ServiceBusSharedStreamProducer(SharedStreamProducer):
    """The Service Bus side of a shared stream; see the module docstring for the policy.

    The constructor validates (raising :class:`ServiceBusConfigError`, a
    ``ValueError``, also when the ``servicebus`` extra is not installed) and
    connects to nothing. ``calls`` counts the calls made, by operation (also
    the OpenTelemetry counter ``sharedstream.broker.requests``).
    """

    advances_lanes_together = True  # each message is settled on its own, lanes apart
    counts_deliveries = True  # Service Bus's delivery count: the store judges a suspect

    def __init__(self, settings: ServiceBusSettings) -> None:
        settings.validate()
        _sdk("azure.servicebus.aio")  # a missing extra fails here
        self.settings = settings
        self.entity = settings.entity_path
        self.calls = BrokerCalls("servicebus")
        self._letters = DeadLetterDesk(self, setting="dead-letter queue", logger=log)
        self._client: Any = None
        self._identity: Any = None  # DefaultAzureCredential, when the producer made one
        self._exit = contextlib.AsyncExitStack()
        self._claimed = False
        self._closed = False
        # A round every second at most: a shorter lock seen on messages (see _shorter_lock)
        # takes effect within a second, not after a quarter of the configured one.
        self._leases: LeaseKeeper[str] = LeaseKeeper(
            self._renew, lease=settings.lock_duration, batch_size=RENEW_BATCH,
            concurrency=_RENEW_CONCURRENCY, margin_round_trips=_MARGIN_ROUND_TRIPS,
            tick=min(1.0, settings.lock_duration / 4), on_lost=self._forget)
        self._renewal: BatchedLockRenewal | None = None  # made with the client (needs the SDK)
        self._held: dict[str, ServiceBusPayload] = {}  # lock token -> payload, while renewed
        self._arrived: dict[str, float] = {}  # lock token -> when it arrived (max renewal)
        self._in_flight = InFlightLimit(settings.max_in_flight)
        self._redelivery = RedeliveryPolicy(settings.max_redeliveries)
        # sequence number -> deliveries of it this process took (see _take); forgotten once the
        # message is completed or dead-lettered, the oldest past _MAX_HOLDS.
        self._taken: DeliveryTally[int] = DeliveryTally(_MAX_HOLDS)
        # Completions go one at a time in turns of the link (see LinkTurns): one sender takes
        # every queued completion, up to _COMPLETE_TURN, per turn.
        self._completes: SettleSender[ServiceBusPayload] = SettleSender(
            self._send_completes, batch_size=_COMPLETE_TURN, senders=1,
            policy=settings.retry_policy(), retry_on=ServiceBusRequestError,
            on_given_up=self._complete_lost)
        # The receive loops (one, or one per session), the completers and the renewals.
        # A worker gone for good must not leave advance or a receive loop waiting on it.
        self._workers: PollWorkers[ServiceBusPayload] = PollWorkers(
            on_broken=(self._completes.interrupt, self._in_flight.interrupt))
        self._floors: LaneFloors[int] = LaneFloors(self._redelivery, capacity=_MAX_HOLDS)
        self._poison = PoisonCheck(self._redelivery, self, logger=log)
        self._open: dict[int, int] = {}  # id(session receiver) -> messages outstanding
        self._turns = LinkTurns()  # one receive or one run of settlements per link at a time
        self._lock_warned = False
        self._linked = False  # a receiver is open and its last receive succeeded (connected)

    @property
    def discarded(self) -> int:
        """Always 0: Service Bus always has a dead-letter sub-queue."""
        return self._letters.discarded

    # -- connection ----------------------------------------------------------------------

    def _connect(self) -> None:
        """Create the client (no I/O until a receiver opens); see :func:`open_client`.

        Guards the SDK's decoder first (process-wide, once): a message it
        cannot decode is dead-lettered alone instead of shutting the link.
        """
        guard_sdk_decoder(_sdk("azure.servicebus._pyamqp.aio._receiver_async"))
        self._client, self._identity = open_client(
            self.settings, _sdk("azure.servicebus.aio"), _sdk("azure.core.credentials"))
        self._renewal = BatchedLockRenewal(
            calls=self.calls, lock_lost=_sdk("azure.servicebus.exceptions").MessageLockLostError,
            timeout=lambda: self._leases.lease, log=log, entity=self.entity)

    def _receiver(self, *, session: bool) -> Any:
        """A peek-lock receiver of the entity (of the next free session when ``session``)."""
        s = self.settings
        kwargs = receiver_options(s, _sdk("azure.servicebus"), session=session)
        if s.queue is not None:
            return self._client.get_queue_receiver(queue_name=s.queue, **kwargs)
        return self._client.get_subscription_receiver(
            topic_name=s.topic, subscription_name=s.subscription, **kwargs)

    async def _call(self, operation: str, call: Callable[[], Awaitable[_T]]) -> _T:
        """One SDK call (counted), its errors wrapped (see :func:`sdk_error`)."""
        self.calls.count(operation)
        servicebus_exceptions = _sdk("azure.servicebus.exceptions")
        try:
            return await call()
        except servicebus_exceptions.ServiceBusError as exc:
            raise sdk_error(f"{operation} on {self.entity}", exc) from exc

    def _claim(self) -> None:
        if not _consumed.claim(self.settings.identity(), self.settings.fingerprint()):
            raise ServiceBusConfigError(
                f"entity {self.entity!r} is already consumed in this process with other "
                "settings; every trigger of one entity must use the same receive, lock and "
                "session settings (two receivers would split its messages)"
            )
        self._claimed = True

    # -- the poll ------------------------------------------------------------------------

    async def open_stream(self) -> AsyncIterator[tuple[Any, Any]]:
        """Open the receiver(s) and yield ``(ServiceBusMessage, ServiceBusPayload)`` pairs."""
        self._claim()
        self._connect()
        s = self.settings
        if s.sessions:
            receivers = [(f"session-{n}", self._session_loop) for n in range(s.max_sessions)]
        else:
            receiver = self._receiver(session=False)
            await self._call("OpenReceiver", receiver.__aenter__)
            self._exit.push_async_callback(self._close, "receiver", receiver.close)
            self._linked = True
            receivers = [("receive", lambda: self._receive_loop(receiver, None))]
        # A worker's error ends the poll (the group restarts); what was received and not
        # advanced is delivered again once its lock lapses: nothing is lost.
        self._workers.start(f"servicebus {self.entity}", [
            *receivers, ("complete", self._completes.run), ("renew", self._leases.run)])
        async for batch in self._workers.batches():
            for payload in batch:
                yield payload.message, payload

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
                    else self._held or not self._completes.idle)
            wait = _GLANCE if busy else min(s.max_wait_time, self._leases.lease / 4)
            started = clock()
            try:
                async with self._turns.lock(receiver):
                    received = await self._call("Receive", functools.partial(
                        receiver.receive_messages, max_message_count=s.max_messages,
                        max_wait_time=wait))
            except ServiceBusProducerError:
                self._linked = False  # the SDK's retries are spent: the poll ends
                raise
            finally:
                in_flight.release(s.max_messages)
            hollow = 0 if received or clock() - started >= wait / 2 else hollow + 1
            if hollow >= _HOLLOW_LIMIT:
                self._linked = False
                raise ServiceBusRequestError(
                    f"Receive on {self.entity} returned nothing at once {hollow} times in a row: "
                    "the SDK's receive link has shut down; the poll restarts")
            self._linked = True
            in_flight.take(len(received))
            if received:
                await self._take(receiver, session, received)
            elif session is not None and not self._open.get(id(receiver)):
                return

    async def _take(self, receiver: Any, session: str | None, received: list[Any]) -> None:
        """Hold the locks of what a receive got and hand it to the poll.

        Dead-letters at once, each alone, a message whose body has no bytes
        (:class:`UndecodableBodyError`, reason ``rejected``) and one
        delivered too often (``max_redeliveries``); neither is fanned out.

        *Too often* counts Service Bus's delivery count less the deliveries
        this process took of the message before and that did not end in one
        of its own failures: a lock that lapsed while the message waited (a
        slow network, a stall), a completion that did not take, a bounce
        behind its session's failed message. Those are redeliveries, not
        failures. What is still too often is only suspect: the store's
        count of the message's own failures decides (:class:`PoisonCheck`),
        so deliveries a crash caused never dead-letter it.
        """
        body_types = _sdk("azure.servicebus.amqp").AmqpMessageBodyType
        now = self._leases.now()
        arrived: list[ServiceBusPayload] = []
        suspects: dict[int, tuple[str | None, int]] = {}
        poison: list[_Disposal] = []
        for raw in received:
            undecodable = ""
            try:
                message = read_message(self.entity, raw, body_types)
            except UndecodableBodyError as exc:
                message, undecodable = exc.message, f"undecodable body: {exc}"
            lane: tuple[str, Hashable] = (("session", session) if session is not None
                                          else ("message", message.sequence_number))
            payload = ServiceBusPayload(lane, message, raw, receiver)
            if session is not None:  # counted off again when settled, fanned out or not
                self._open[id(receiver)] = self._open.get(id(receiver), 0) + 1
            if undecodable:
                log.warning("dead-lettering a message whose body does not decode",
                            entity=self.entity, sequence_number=message.sequence_number,
                            detail=undecodable)
                poison.append((payload, REASON_REJECTED, (), undecodable))
                continue
            number = message.sequence_number
            earlier = self._taken.get(number)
            self._taken.add(number)
            if self._floors.poisoned_on_arrival(number, message.delivery_count + 1,
                                                taken=earlier):
                suspects[len(arrived)] = (self.raw_event_name(payload),
                                          message.delivery_count + 1)
            arrived.append(payload)
        confirmed = await self._poison.confirmed(suspects)
        taken: list[ServiceBusPayload] = []
        for index, payload in enumerate(arrived):
            if index in confirmed:  # failed too often itself: never fan it out again
                poison.append((payload, REASON_MAX_REDELIVERIES, (), ""))
                continue
            if session is None:
                self._hold(payload, now)
            taken.append(payload)
        if taken:
            self._workers.put(taken)
        if poison:
            self._in_flight.release(len(poison))
            await self._dispose(poison)

    def _hold(self, payload: ServiceBusPayload, now: float) -> None:
        """Renew ``payload``'s lock from now on, planned on the lock it came with."""
        token, until = payload.key, payload.received.locked_until_utc
        left = self.settings.lock_duration
        if until is not None:
            seen = (until - datetime.now(UTC)).total_seconds()
            if seen < self._leases.lease - 1:  # the entity's lock is shorter than configured
                self._shorter_lock(seen)
            left = min(left, max(seen, 0.0))
        self._leases.hold(token, now + left)
        self._held[token] = payload
        self._arrived[token] = now

    def _shorter_lock(self, seen: float) -> None:
        """Plan renewals on a lock shorter than ``lock_duration``: the one the messages show."""
        lease = max(1.0, seen)
        if self._leases.shorten(lease) and not self._lock_warned:
            self._lock_warned = True
            log.warning("message locks are shorter than lock_duration; renewing on theirs",
                        entity=self.entity, lock_s=round(lease),
                        lock_duration_s=self.settings.lock_duration)

    # -- sessions ------------------------------------------------------------------------

    async def _session_loop(self) -> None:
        """Take the next free session, receive it until idle, let it go; forever."""
        servicebus_exceptions = _sdk("azure.servicebus.exceptions")
        while True:
            receiver = self._receiver(session=True)
            try:
                await self._call("AcceptSession", receiver.__aenter__)
            except ServiceBusProducerError as exc:
                await self._close("session receiver", receiver.close)
                if isinstance(exc.__cause__, servicebus_exceptions.OperationTimeoutError):
                    self._linked = True  # Service Bus answered: no session has messages now
                    continue  # ask again
                self._linked = False
                raise
            self._linked = True
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
                log.warning("lost a session lock; what was received from it and not settled "
                            "comes again", entity=self.entity, session=session)
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
            left = float(self._leases.lease)
            until = receiver.session.locked_until_utc
            if until is not None:
                left = min(left, (until - datetime.now(UTC)).total_seconds())
            await asyncio.sleep(max(0.2, left / 2))
            await self._call("RenewSessionLock", receiver.session.renew_lock)

    # -- the engine's calls --------------------------------------------------------------

    async def broker_backlog(self) -> BrokerBacklog:
        """The entity's active and dead-letter counts (see ``_servicebus_backlog``)."""
        return await entity_backlog(self.settings, _sdk)

    @property
    def connected(self) -> bool | None:
        """Whether a receiver is open and the last receive (or session accept) succeeded.

        ``False`` until the receiver opens; ``True`` from then on, also while
        a session receiver waits for a session with messages (Service Bus
        answered that there is none); ``False`` after a receive, open or
        accept failed with the SDK's retries spent, which ends the poll, so
        it stays ``False`` for this producer. The SDK's own retries and
        reconnects happen inside one receive call and are not seen here.
        """
        return self._linked

    def get_advance_lane(self, broker_payload: Any) -> Hashable:
        """``("session", session id)``, or ``("message", sequence number)`` without sessions."""
        lane: Hashable = broker_payload.lane
        return lane

    def raw_event_name(self, broker_payload: Any) -> str | None:
        """``<entity path>/<sequence number>``: the same for every redelivery."""
        return f"{self.entity}/{broker_payload.message.sequence_number}"

    def raw_event_fingerprint(self, broker_payload: Any) -> str | None:
        """``<enqueued time>-<CRC-32 of the body>``: sequence numbers restart with a new entity.

        The same for every redelivery (Service Bus keeps both with the
        message); a new message that got a stored one's sequence number
        differs unless it was enqueued at the same instant with the same body.
        """
        message = broker_payload.message
        return message_fingerprint(message.enqueued_time, message.body)

    def trace_carrier(self, raw_event: Any, broker_payload: Any) -> Mapping[str, str] | None:
        """The application properties (``traceparent``, or Azure's ``Diagnostic-Id``)."""
        properties = raw_event.properties
        return carrier_of(properties) if properties else None

    @property
    def messaging_attributes(self) -> Mapping[str, str]:
        """``servicebus`` and the entity (a queue, or topic/subscriptions/name)."""
        return {"messaging.system": "servicebus", "messaging.destination.name": self.entity}

    async def advance(self, batch: Sequence[AdvanceItem]) -> None:
        """Complete, abandon or dead-letter each message of one lane's resolved prefix.

        Raises only when the client is broken (a worker failed for good);
        per-message problems are logged with the sequence number.
        """
        if self._workers.broken is not None:
            raise ServiceBusRequestError(
                f"the Service Bus client is broken: {self._workers.broken}")
        self._in_flight.release(len(batch))
        completes, abandons, dispose = self._sort(batch)
        if abandons:
            await self._abandon(abandons)
        if dispose:
            await self._dispose(dispose)
        if completes:
            await self._completes.put(completes)

    def _sort(self, batch: Sequence[AdvanceItem]) -> tuple[
        list[ServiceBusPayload], list[ServiceBusPayload], list[_Disposal]
    ]:
        """Split a batch into completions, abandons and dead letters; stop their renewals.

        A session lane's first failed message becomes its *floor*: the
        session's later messages are abandoned behind it, uncounted, so they
        come again after it, in order. Synchronous, so renewal of every item
        but the completions stops before anything is awaited; a completion's
        lock is renewed until the completion is sent (it may wait in the
        settle sender's backlog for a while).
        """
        completes: list[ServiceBusPayload] = []
        abandons: list[ServiceBusPayload] = []
        dispose: list[_Disposal] = []
        place = self._floors.place
        for payload, outcome in batch:
            lane = payload.lane
            where = place(lane, payload.message.sequence_number, outcome,
                          ordered=lane[0] == "session")
            if where != SETTLE:
                self._settled(payload)
            if where == SETTLE:
                completes.append(payload)
            elif where in (AGAIN, BOUNCE):
                abandons.append(payload)
            elif where == POISON:
                dispose.append((payload, REASON_MAX_REDELIVERIES, outcome.verdicts, ""))
            elif where == REJECTED:
                dispose.append((payload, REASON_REJECTED, outcome.verdicts, ""))
            else:  # LEAVE: fanned out to nobody; its lock lapses and it is delivered again
                self._done([payload])
        return completes, abandons, dispose

    def _settled(self, payload: ServiceBusPayload) -> None:
        """Stop renewing ``payload`` (it is being settled). Idempotent."""
        token = payload.key
        self._leases.settle(token)
        self._held.pop(token, None)
        self._arrived.pop(token, None)

    def _done(self, payloads: Sequence[ServiceBusPayload]) -> None:
        """``payloads`` were settled (or given up): count them off their sessions.

        Only then may a session's receiver close (settling needs it open).
        """
        for payload in payloads:
            if payload.lane[0] == "session":
                key = id(payload.receiver)
                if key in self._open:
                    self._open[key] -= 1

    def _forget(self, tokens: list[str]) -> None:
        for token in tokens:
            self._held.pop(token, None)
            self._arrived.pop(token, None)

    # -- settlements ---------------------------------------------------------------------

    async def _settle_each(self, operation: str, payloads: Sequence[ServiceBusPayload],
                           settle: Callable[[ServiceBusPayload], Awaitable[None]], *,
                           in_turn: bool = False) -> list[tuple[ServiceBusPayload, BaseException]]:
        """Every settlement of this producer: :func:`settle_each` on its links; what raised."""
        return await settle_each(operation, payloads, settle, calls=self.calls,
                                 turns=self._turns, concurrency=self.settings.settle_concurrency,
                                 in_turn=in_turn)

    async def _send_completes(self, chunk: Sequence[ServiceBusPayload]) -> list[
            tuple[ServiceBusPayload, str]]:
        """Complete a chunk; returns what failed transiently (the sender retries it).

        Each lock is renewed until its own completion leaves (a chunk of
        hundreds takes as many round trips, one after the other).
        """
        async def complete(payload: ServiceBusPayload) -> None:
            self._settled(payload)
            await payload.receiver.complete_message(payload.received)

        failed = await self._settle_each("Complete", chunk, complete, in_turn=True)
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

    def _complete_lost(self, payload: ServiceBusPayload, detail: str) -> None:
        """The settle sender gave a completion up after its retries."""
        self._report(logging.WARNING, _COMPLETE_LOST, [(payload, detail)])
        self._done([payload])

    def _report(self, level: int, event: str,
                failed: Sequence[tuple[ServiceBusPayload, str]]) -> None:
        report_failures(log, level, event, self.entity, failed)

    async def _abandon(self, payloads: list[ServiceBusPayload]) -> None:
        log.info("abandoning messages", entity=self.entity, count=len(payloads),
                 sequence_numbers=[p.message.sequence_number for p in payloads])
        failed = await self._settle_each(
            "Abandon", payloads, lambda p: p.receiver.abandon_message(p.received))
        self._report(logging.WARNING,
                     "abandoning messages did not take; their locks lapse and they come again",
                     [(p, said(exc)) for p, exc in failed])
        self._done(payloads)

    async def _dispose(self, items: list[_Disposal]) -> None:
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
        failed = await self._settle_each("DeadLetter", [p for p, *_ in items], dead_letter)
        refused = {id(p) for p, _ in failed}
        self._report(logging.ERROR, "dead-lettering messages did not take; their locks lapse, "
                     "they come again and are dead-lettered then",
                     [(p, said(exc)) for p, exc in failed])
        for payload, reason, verdicts, _ in items:
            number = payload.message.sequence_number
            if id(payload) in refused:
                continue
            self._floors.forget(number)
            self._taken.forget(number)
            self._letters.sent(f"{number}", f"{self.entity}/$DeadLetterQueue", reason, verdicts)
        self._done([payload for payload, *_ in items])

    async def _renew(self, tokens: Sequence[str]) -> list[str]:
        """The lease keeper's renewal: each lock up to ``max_lock_renewal`` after arrival.

        Batched (:class:`BatchedLockRenewal`), outside the link's turns: a
        renewal never waits for a receive or a run of completions. A lock
        Service Bus says is lost is no longer renewed (its message comes
        again); one whose request was not answered is tried next round.
        """
        now, limit = self._leases.now(), self.settings.max_lock_renewal
        due = [t for t in tokens if t in self._held and now - self._arrived.get(t, now) < limit]
        if len(due) < len(tokens):
            log.warning("locks reached max_lock_renewal or were settled; Service Bus delivers "
                        "them again", entity=self.entity, count=len(tokens) - len(due),
                        limit_s=limit)
        if not due or self._renewal is None:
            return []
        renewal = await self._renewal.renew([self._held[t] for t in due],
                                            wanted=lambda p: p.key in self._held)
        for payload, _ in renewal.lost:
            self._leases.settle(payload.key)
            self._forget([payload.key])
        self._report(logging.WARNING, "message locks were lost before they were renewed; "
                     "Service Bus delivers those messages again", renewal.lost)
        self._report(logging.INFO, "renewing message locks did not take; tried again next "
                     "round until the lock expires", renewal.failed)
        return [p.key for p in renewal.renewed]

    # -- re-driving ----------------------------------------------------------------------

    async def republish(self, letters: Sequence[DeadLetter]) -> None:
        """Send kept dead letters again to the entity, as new messages (new sequence numbers).

        Outside any poll, on a client of its own (closed before this
        returns): to the queue, or for a subscription to its topic (every
        subscription of it gets the copies). Body and application properties
        (text) as kept, in order; ``message_id`` a digest of source and
        payload (an entity with duplicate detection drops a repeat); on a
        session entity the session ``sharedstream-redrive`` (none is kept).
        Raises :class:`ServiceBusRepublishError` for a letter refused (a
        header that is not UTF-8, a letter too large: nothing sent) or a send
        that failed (earlier batches sent), and
        :class:`ServiceBusConfigError` for a missing entity or refused
        credential. See :mod:`sharedstream.producers._servicebus_republish`.
        """
        await republish_messages(
            letters, settings=self.settings, close=self._close, calls=self.calls, sdk=_sdk,
            connect=lambda: open_client(self.settings, _sdk("azure.servicebus.aio"),
                                        _sdk("azure.core.credentials")))

    # -- closing -------------------------------------------------------------------------

    async def _close(self, what: str, close: Callable[[], Awaitable[None]]) -> None:
        """``close()``, given up after :data:`CLOSE_TIMEOUT` seconds (one warning says so)."""
        try:
            async with asyncio.timeout(CLOSE_TIMEOUT):
                await close()
        except TimeoutError:
            log.warning("closing the SDK's handle did not finish; given up", entity=self.entity,
                        handle=what, timeout_s=CLOSE_TIMEOUT)

    async def aclose(self) -> None:
        """Flush queued completions (10 s at most), stop the workers and the client, once."""
        if self._closed:
            return
        self._closed = True
        try:
            await self._completes.flush(10)
        finally:
            await self._workers.stop()
            if self._completes.queued:
                log.warning("completions not sent before closing; those messages come again "
                            "and their events are skipped as duplicates", entity=self.entity,
                            count=self._completes.queued)
            if self._claimed:
                _consumed.release(self.settings.identity(), self.settings.fingerprint())
            await self._exit.aclose()
            if self._client is not None:
                await self._close("client", self._client.close)
            if self._identity is not None:
                await self._identity.close()
