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
management request (:mod:`~sharedstream.producers._servicebus_message_locks`,
:mod:`~sharedstream.producers._servicebus_locks`),
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

**Stopping.** The poll's workers stop by cancellation. The SDK can lose
one (on Python 3.11 its frame reads swallow a cancellation that meets a
frame), and a session worker that then took the accept's timeout for "no
session free" would ask again forever: every SDK call runs under
:func:`~sharedstream.brokerkit.cancellation.cancellation_kept`, which raises
the lost cancellation once the call returns.

**Back-pressure.** Receiving pauses while ``max_in_flight`` messages are
received and not yet advanced; nothing is prefetched beyond what a receive
call asks for (a prefetched message's lock would tick unseen).

Two triggers with different consumer settings on one entity would be two
competing receivers, each message reaching only one of them: a second
producer for an entity already consumed in this process with other
settings is refused (:class:`ServiceBusConfigError`).

The plumbing is the broker kit's (:mod:`sharedstream.brokerkit`); what is
here is Service Bus's: the client, taking what arrives and sorting what was
advanced. The receive loops and sessions are in
:mod:`~sharedstream.producers._servicebus_receive`, the settlements in
:mod:`~sharedstream.producers._servicebus_settle`, the locks held and
renewed in :mod:`~sharedstream.producers._servicebus_message_locks`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable, Mapping, Sequence
from typing import Any, TypeVar

from sharedstream.brokerkit.calls import BrokerCalls
from sharedstream.brokerkit.cancellation import cancellation_kept
from sharedstream.brokerkit.deadletters import (
    REASON_MAX_REDELIVERIES,
    REASON_REJECTED,
    DeadLetterDesk,
)
from sharedstream.brokerkit.fingerprints import SourceClaims
from sharedstream.brokerkit.floors import AGAIN, BOUNCE, POISON, REJECTED, SETTLE, LaneFloors
from sharedstream.brokerkit.inflight import InFlightLimit
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
)
from sharedstream.engine.tracing import carrier_of
from sharedstream.producers._servicebus_backlog import entity_backlog
from sharedstream.producers._servicebus_locks import BatchedLockRenewal
from sharedstream.producers._servicebus_message_locks import MessageLocks
from sharedstream.producers._servicebus_receive import Receivers
from sharedstream.producers._servicebus_received import (
    UndecodableBodyError,
    guard_sdk_decoder,
    read_message,
)
from sharedstream.producers._servicebus_republish import (
    ServiceBusRepublishError,
    dead_letter_message,
    republish_messages,
)
from sharedstream.producers._servicebus_settle import Disposal, LinkTurns, Settlements
from sharedstream.producers._servicebus_types import (
    ServiceBusConfigError,
    ServiceBusMessage,
    ServiceBusPayload,
    ServiceBusProducerError,
    ServiceBusRequestError,
    ServiceBusSettings,
    namespace_of,
    open_client,
    receiver_options,
    sdk_error,
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
_MAX_HOLDS = 4096
_COMPLETE_TURN = 500
"""Completions sent in one turn of a receiver's link at most."""
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
        self._locks = MessageLocks(settings, entity=self.entity, logger=log)
        self._in_flight = InFlightLimit(settings.max_in_flight)
        self._redelivery = RedeliveryPolicy(settings.max_redeliveries)
        # sequence number -> deliveries of it this process took (see _take); forgotten once the
        # message is completed or dead-lettered, the oldest past _MAX_HOLDS.
        self._taken: DeliveryTally[int] = DeliveryTally(_MAX_HOLDS)
        self._floors: LaneFloors[int] = LaneFloors(self._redelivery, capacity=_MAX_HOLDS)
        self._open: dict[int, int] = {}  # id(session receiver) -> messages outstanding
        self._turns = LinkTurns()  # one receive or one run of settlements per link at a time
        self._settlements = Settlements(
            entity=self.entity, calls=self.calls, turns=self._turns,
            concurrency=settings.settle_concurrency, settled=self._locks.settled,
            done=self._done, taken=self._taken, floors=self._floors, letters=self._letters,
            logger=log)
        # Completions go one at a time in turns of the link (see LinkTurns): one sender takes
        # every queued completion, up to _COMPLETE_TURN, per turn.
        self._completes: SettleSender[ServiceBusPayload] = SettleSender(
            self._settlements.complete, batch_size=_COMPLETE_TURN, senders=1,
            policy=settings.retry_policy(), retry_on=ServiceBusRequestError,
            on_given_up=self._settlements.complete_lost)
        # The receive loops (one, or one per session), the completers and the renewals.
        # A worker gone for good must not leave advance or a receive loop waiting on it.
        self._workers: PollWorkers[ServiceBusPayload] = PollWorkers(
            on_broken=(self._completes.interrupt, self._in_flight.interrupt))
        self._poison = PoisonCheck(self._redelivery, self, logger=log)
        self._receivers = Receivers(
            settings, entity=self.entity, sdk=_sdk, call=self._call, receiver=self._receiver,
            close=self._close, take=self._take, in_flight=self._in_flight, turns=self._turns,
            outstanding=self._open, lock=lambda: self._locks.keeper.lease, logger=log,
            unsettled=lambda: bool(self._locks.held) or not self._completes.idle)

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
        self._locks.connect(BatchedLockRenewal(
            calls=self.calls, lock_lost=_sdk("azure.servicebus.exceptions").MessageLockLostError,
            timeout=lambda: self._locks.keeper.lease, log=log, entity=self.entity))

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
            with cancellation_kept():  # the SDK can lose a stop's cancellation: keep it
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
        receivers = await self._receivers.open(self._exit)
        # A worker's error ends the poll (the group restarts); what was received and not
        # advanced is delivered again once its lock lapses: nothing is lost.
        self._workers.start(f"servicebus {self.entity}", [
            *receivers, ("complete", self._completes.run), ("renew", self._locks.keeper.run)])
        async for batch in self._workers.batches():
            for payload in batch:
                yield payload.message, payload

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
        now = self._locks.keeper.now()
        arrived: list[ServiceBusPayload] = []
        suspects: dict[int, tuple[str | None, int]] = {}
        poison: list[Disposal] = []
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
        taken, confirmed = await self._poison.split(arrived, suspects)
        # failed too often itself: never fan it out again
        poison.extend((payload, REASON_MAX_REDELIVERIES, (), "") for payload in confirmed)
        if session is None:
            for payload in taken:
                self._locks.hold(payload, now)
        if taken:
            self._workers.put(taken)
        if poison:
            self._in_flight.release(len(poison))
            await self._settlements.dead_letter(poison)

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
        return self._receivers.linked

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
        ``None`` for a message without its enqueued time (one rebuilt from a
        dead letter, see :meth:`dead_letter_event`): the store matches it by
        name alone rather than by a fingerprint that is not the message's.
        """
        message = broker_payload.message
        if message.enqueued_time is None:
            return None
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
            await self._settlements.abandon(abandons)
        if dispose:
            await self._settlements.dead_letter(dispose)
        if completes:
            await self._completes.put(completes)

    def _sort(self, batch: Sequence[AdvanceItem]) -> tuple[
        list[ServiceBusPayload], list[ServiceBusPayload], list[Disposal]
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
        dispose: list[Disposal] = []
        place = self._floors.place
        for payload, outcome in batch:
            lane = payload.lane
            where = place(lane, payload.message.sequence_number, outcome,
                          ordered=lane[0] == "session")
            if where != SETTLE:
                self._locks.settled(payload)
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

    def _done(self, payloads: Sequence[ServiceBusPayload]) -> None:
        """``payloads`` were settled (or given up): count them off their sessions.

        Only then may a session's receiver close (settling needs it open).
        """
        for payload in payloads:
            if payload.lane[0] == "session":
                key = id(payload.receiver)
                if key in self._open:
                    self._open[key] -= 1

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

    def dead_letter_event(self, letter: DeadLetter) -> tuple[Any, Any] | None:
        """The ``(ServiceBusMessage, ServiceBusPayload)`` a kept letter was, or ``None``.

        For a replay of a watcher's dead letters: the sequence number from
        ``letter.source`` (so :meth:`raw_event_name` is the live one), body
        and application properties as kept; no enqueued time, so
        :meth:`raw_event_fingerprint` is ``None`` (see
        :func:`~sharedstream.producers._servicebus_republish.dead_letter_message`).
        ``None`` when ``source`` names no message of this entity. The
        payload has no SDK message or receiver and is never settled.
        """
        message = dead_letter_message(self.entity, letter)
        if message is None:
            return None
        lane = ("message", message.sequence_number)
        return message, ServiceBusPayload(lane, message, None, None)

    # -- closing -------------------------------------------------------------------------

    async def _close(self, what: str, close: Callable[[], Awaitable[None]]) -> None:
        """``close()``, given up after :data:`CLOSE_TIMEOUT` seconds (one warning says so)."""
        try:
            async with asyncio.timeout(CLOSE_TIMEOUT):
                with cancellation_kept():  # else a deadline the SDK loses leaves it unbounded
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
