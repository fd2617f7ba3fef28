"""Google Pub/Sub: one streaming pull shared by every trigger of a subscription (ack mode).

:class:`PubSubSharedStreamProducer` reads a subscription with the async
GAPIC client of ``google-cloud-pubsub`` (the ``pubsub`` extra: ``pip install
'sharedstream[pubsub]'``) on the event loop: one ``StreamingPull`` per group,
whose flow control (``max_outstanding_messages`` / ``_bytes``) is the
read-ahead. Each advanced outcome becomes a broker action:

* **clean** - acknowledged. Acks are queued and sent by ``ack_concurrency``
  background senders in ``Acknowledge`` calls of up to 2,500 ack ids (the
  kit's settle sender); ``advance`` returns once they are queued (the
  events are stored already: a crash before the ack only redelivers the
  message, and the store skips its events).
* **failed** - nacked (``ModifyAckDeadline`` 0): redelivered, by Pub/Sub's
  retry policy, to the subscription; the engine hands it to the failed
  watcher only (the others skip it as already seen). Past
  ``max_redeliveries`` counted failures it is dead-lettered instead.
* **rejected** - published to ``dead_letter_topic`` (original data and
  attributes plus ``sharedstream.*`` attributes naming the source, the
  reason, the triggers and what they said), then acked once the publish
  succeeded; without a topic, or when Pub/Sub refuses the copy for good,
  handed to the engine's dead-letter fallback, or discarded with a warning.
* **fanned out to nobody** - left alone: its lease is no longer renewed and
  Pub/Sub redelivers it once its ack deadline passes.

**Lanes.** A message with an ordering key is in that key's lane: the
engine advances the key's messages in order, and behind a failed one the
key's later messages are nacked too (not counted against them), so that
they come again after it, in order. A message without an ordering key is
its own lane: it never waits for another.

**Leases.** Every message is received with the stream's ack deadline
(``ack_deadline``) and its lease is extended (``ModifyAckDeadline``, in
batches) by the kit's lease keeper while it waits for subscribers and the
persistence gate, up to ``max_lease_duration`` after it arrived; the
extension stops the moment it is advanced. A slow watcher therefore causes
no redelivery.

**Poison.** Pub/Sub reports ``delivery_attempt`` on subscriptions with a
dead-letter policy: a message that arrives with more than
``max_redeliveries + 1`` attempts (less those that were not its own doing:
bounced behind a failed message of its key, or taken by this process and not
failed - a replay of its ordering key redelivers it while a copy is held
here) is a suspect, dead-lettered without being fanned out only if the store
counted more than ``max_redeliveries`` failures of its own (attempts a
crash caused are not: :class:`~sharedstream.brokerkit.redelivery.PoisonCheck`),
or if its attempts are past the ceiling. The producer also counts each
message's own failures itself, so the rule holds without that policy.

**Exactly-once delivery.** On a subscription with exactly-once delivery
Pub/Sub reports, per ack id, whether an ack or a deadline change took: a
transient failure is retried by the settle sender, a permanent one
(``PERMANENT_FAILURE_INVALID_ACK_ID``: the lease expired) means the broker
redelivers the message. That is safe: its events were stored under a key
made of the subscription and the message id (:meth:`raw_event_name`), so
the redelivered copy adds nothing. Without exactly-once, acks are best
effort on Pub/Sub's side and the same keys absorb the rare redelivery.

**Streams that keep ending.** A streaming pull that Pub/Sub ends is
reopened. One that ends the same way again and again, soon after it
opened (a message larger than the channel takes, say), is reopened all
the same but said: a WARNING with the count, and :attr:`connected` is
``False`` meanwhile (:mod:`~sharedstream.producers._pubsub_pull`,
:mod:`~sharedstream.producers._pubsub_stream_ends`). Our channels to an
emulator host take messages of any size, as Google's transport does
(:data:`~sharedstream.producers._pubsub_types.CHANNEL_OPTIONS`); Pub/Sub's
own limit is 10 MB.

Two triggers of one subscription with different consumer settings would
be two competing streams: a second producer for a subscription already
consumed in this process with other settings is refused
(:class:`PubSubConfigError`).

The plumbing is the broker kit's (:mod:`sharedstream.brokerkit`): the lazy
SDK import, retries, the in-flight limit, the dead-letter desk, the
redelivery rule, the lease keeper, the settle sender and source claims.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable, Mapping, Sequence
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
from sharedstream.brokerkit.redelivery import DeliveryTally, PoisonCheck, RedeliveryPolicy
from sharedstream.brokerkit.settle import SettleSender
from sharedstream.brokerkit.workers import PollWorkers
from sharedstream.engine.errors import BacklogUnavailable
from sharedstream.engine.keyvalue_log import key_value_logger
from sharedstream.engine.producer import (
    AdvanceItem,
    BrokerBacklog,
    DeadLetter,
    SharedStreamProducer,
)
from sharedstream.engine.replay import ReplayError
from sharedstream.engine.tracing import carrier_of
from sharedstream.producers._pubsub_client import SDK, pubsub_clients, unary
from sharedstream.producers._pubsub_deadletters import Disposal, PubSubDeadLetters
from sharedstream.producers._pubsub_pull import StreamingPull
from sharedstream.producers._pubsub_republish import PubSubRepublishError, republish_messages
from sharedstream.producers._pubsub_types import (
    ACK_BATCH,
    DLQ_ATTRIBUTE_DELIVERY_ATTEMPT,
    DLQ_ATTRIBUTE_DETAIL,
    DLQ_ATTRIBUTE_MESSAGE_ID,
    DLQ_ATTRIBUTE_REASON,
    DLQ_ATTRIBUTE_SUBSCRIPTION,
    DLQ_ATTRIBUTE_TRIGGERS,
    PubSubConfigError,
    PubSubDeadLetterError,
    PubSubMessage,
    PubSubPayload,
    PubSubProducerError,
    PubSubRequestError,
    PubSubSettings,
    ack_failures,
    raw_request,
    sdk_error,
    transient,
)

__all__ = [
    "DLQ_ATTRIBUTE_DELIVERY_ATTEMPT",
    "DLQ_ATTRIBUTE_DETAIL",
    "DLQ_ATTRIBUTE_MESSAGE_ID",
    "DLQ_ATTRIBUTE_REASON",
    "DLQ_ATTRIBUTE_SUBSCRIPTION",
    "DLQ_ATTRIBUTE_TRIGGERS",
    "PubSubConfigError",
    "PubSubDeadLetterError",
    "PubSubMessage",
    "PubSubPayload",
    "PubSubProducerError",
    "PubSubRepublishError",
    "PubSubRequestError",
    "PubSubSettings",
    "PubSubSharedStreamProducer",
    "pubsub_clients",
]

log = key_value_logger(__name__)

_T = TypeVar("_T")
_MAX_HOLDS = 4096
_CALL_TIMEOUT = 30.0

_consumed = SourceClaims()
"""Subscriptions consumed in this process, and the settings fingerprint consuming each."""


PUBSUB_BACKLOG_REASON = (
    "the Pub/Sub API gives no backlog; Cloud Monitoring does "
    "(pubsub.googleapis.com/subscription/num_undelivered_messages)")
"""Why a Pub/Sub stream's broker backlog shows ``n/a``."""


class PubSubSharedStreamProducer(SharedStreamProducer):
    """The Pub/Sub side of a shared stream; see the module docstring for the policy.

    The constructor validates (raising :class:`PubSubConfigError`, a
    ``ValueError``, also when the ``pubsub`` extra is not installed) and
    connects to nothing. ``calls`` counts the API calls made, by operation
    (also the OpenTelemetry counter ``sharedstream.broker.requests``).
    """

    advances_lanes_together = True  # each message is settled on its own, lanes apart
    counts_deliveries = True  # delivery_attempt (with a dead-letter policy): the store judges

    def __init__(self, settings: PubSubSettings) -> None:
        settings.validate()
        SDK("google.pubsub_v1.services.subscriber")  # a missing extra fails here
        self.settings = settings
        self.subscription = settings.subscription_path
        self.calls = BrokerCalls("pubsub")
        self._letters = DeadLetterDesk(self, setting="dead_letter_topic", logger=log)
        self._subscriber: Any = None
        self._publisher: Any = None
        self._claimed = False
        self._closed = False
        self._exactly_once = False
        self._deadlines = asyncio.Lock()  # renewals and nacks never race each other
        self._leases: LeaseKeeper[str] = LeaseKeeper(
            self._renew, lease=settings.ack_deadline, batch_size=ACK_BATCH,
            guard=self._deadlines, on_lost=self._forget_leases)
        self._arrived: dict[str, float] = {}  # ack id -> when it arrived (max lease)
        self._in_flight = InFlightLimit(settings.max_in_flight)
        self._redelivery = RedeliveryPolicy(settings.max_redeliveries)
        self._acks: SettleSender[PubSubPayload] = SettleSender(
            self._send_acks, batch_size=ACK_BATCH, senders=settings.ack_concurrency,
            policy=settings.retry_policy(), retry_on=PubSubRequestError,
            on_given_up=_ack_lost)
        # The streaming pull, the ack senders and the renewals; one batch per response. A
        # worker gone for good must not leave advance or the pull waiting on it.
        self._workers: PollWorkers[PubSubPayload] = PollWorkers(
            on_broken=(self._acks.interrupt, self._in_flight.interrupt))
        self._floors: LaneFloors[str] = LaneFloors(self._redelivery, capacity=_MAX_HOLDS)
        # message id -> deliveries of it this process took (see _take): a replay of an ordering
        # key redelivers messages still held here, and those deliveries were not failures.
        # Not forgotten when a copy is settled (that copy's ack id may be stale, another copy
        # on its way): only the oldest past _MAX_HOLDS go, which makes the rule later, not early.
        self._taken: DeliveryTally[str] = DeliveryTally(_MAX_HOLDS)
        self._poison = PoisonCheck(self._redelivery, self, logger=log)
        self._pull = StreamingPull(settings, client_id=uuid.uuid4().hex, call=self._call,
                                   sdk=SDK, take=self._take, room=self._in_flight.room,
                                   clock=self._leases.now, logger=log)
        self._dead_letters = PubSubDeadLetters(
            call=self._call, sdk=SDK, letters=self._letters, ack=self._ack_disposed,
            nack=self._nack, timeout=_CALL_TIMEOUT, logger=log)

    @property
    def discarded(self) -> int:
        """Messages dropped: no dead-letter topic and no fallback."""
        return self._letters.discarded

    # -- connection ----------------------------------------------------------------------

    def _connect(self) -> None:
        """Create the async GAPIC clients (no I/O until the first call); see :meth:`_clients`."""
        self._subscriber, self._publisher = self._clients(
            publisher=self.settings.dead_letter_path is not None)

    def _clients(self, *, publisher: bool) -> tuple[Any, Any]:
        """New async GAPIC clients: a subscriber, and a publisher (or ``None``). No I/O yet.

        See :func:`pubsub_clients`. The caller closes them (``client.transport.close()``).
        """
        host = self.settings.emulator_host or os.environ.get("PUBSUB_EMULATOR_HOST")
        ca_file = self.settings.tls_ca_file
        subscriber = pubsub_clients(host, "subscriber", ca_file=ca_file)
        return subscriber, pubsub_clients(host, "publisher", ca_file=ca_file) if publisher else None

    async def _call(self, operation: str, call: Callable[[], Awaitable[_T]]) -> _T:
        """One unary call (counted), transient errors retried, the rest wrapped: :func:`unary`."""
        return await unary(operation, call, calls=self.calls,
                           policy=self.settings.retry_policy(), subscription=self.subscription)

    def _claim(self) -> None:
        if not _consumed.claim(self.settings.identity(), self.settings.fingerprint()):
            raise PubSubConfigError(
                f"subscription {self.subscription!r} is already consumed in this process with "
                "other settings; every trigger of one subscription must use the same flow "
                "control, lease and dead-letter settings (two streams would split its messages)"
            )
        self._claimed = True

    # -- the poll ------------------------------------------------------------------------

    async def open_stream(self) -> AsyncIterator[tuple[Any, Any]]:
        """Open the streaming pull and yield ``(PubSubMessage, PubSubPayload)`` pairs."""
        self._claim()
        self._connect()
        # A worker's error ends the poll (the group restarts); what was received and not
        # advanced is redelivered once its deadline passes: nothing is lost.
        self._workers.start(f"pubsub {self.subscription}", [
            ("pull", lambda: self._pull.run(self._subscriber)), ("ack", self._acks.run),
            ("lease", self._leases.run)])
        async for batch in self._workers.batches():
            for payload in batch:
                yield payload.message, payload

    async def _take(self, response: Any) -> None:
        """Hold the leases of a response's messages and hand them to the poll."""
        if response.HasField("subscription_properties"):
            self._exactly_once = response.subscription_properties.exactly_once_delivery_enabled
        now = self._leases.now()
        expires = now + self.settings.ack_deadline
        arrived: list[PubSubPayload] = []
        suspects: dict[int, tuple[str | None, int]] = {}
        for received in response.received_messages:
            message = PubSubMessage(self.subscription, received)
            key = message.ordering_key
            lane: Hashable = ("key", key) if key else ("message", message.message_id)
            payload = PubSubPayload(received.ack_id, lane, message)
            self._leases.hold(payload.ack_id, expires)
            self._arrived[payload.ack_id] = now
            attempt = message.delivery_attempt
            earlier = self._taken.get(message.message_id)
            self._taken.add(message.message_id)
            if attempt is not None and self._floors.poisoned_on_arrival(
                    message.message_id, attempt, taken=earlier):
                # Delivered that often without resolving: the store says whether it is poison.
                suspects[len(arrived)] = (self.raw_event_name(payload), attempt)
            arrived.append(payload)
        taken, poison = await self._poison.split(arrived, suspects)
        self._in_flight.take(len(taken))
        if taken:
            self._workers.put(taken)
        if poison:  # failed too often itself: never fan it out again
            await self._dispose([(payload, REASON_MAX_REDELIVERIES, ()) for payload in poison])

    # -- the engine's calls --------------------------------------------------------------

    async def broker_backlog(self) -> BrokerBacklog:
        """Not available: Pub/Sub's API has no backlog count (see docs/operations.md)."""
        raise BacklogUnavailable(PUBSUB_BACKLOG_REASON)

    @property
    def connected(self) -> bool | None:
        """Whether the streaming pull is open: ``False`` until it first opens, and while reopening.

        It turns ``False`` when a stream ends with an error (Pub/Sub away, a
        broken connection) and ``True`` again once a new stream is open,
        through the retry policy's attempts; after the last one failed the
        poll ends, and it stays ``False``. It is also ``False`` while the
        streams keep ending with the same error (from the third time in a
        row until a stream has stayed open ``ack_deadline`` + 60 s): open
        for a moment, they receive nothing past the failure, and the
        triggerer's ``/readyz`` says so. Unary calls (acks, deadlines) do
        not change it: they are retried, or lapse, on their own.
        """
        return self._pull.open and not self._pull.ends.failing()

    def get_advance_lane(self, broker_payload: Any) -> Hashable:
        """``("key", ordering_key)``, or ``("message", message_id)`` without a key."""
        lane: Hashable = broker_payload.lane
        return lane

    def raw_event_name(self, broker_payload: Any) -> str | None:
        """``<subscription path>/<message id>``: the same for every redelivery."""
        return f"{self.subscription}/{broker_payload.message.message_id}"

    def trace_carrier(self, raw_event: Any, broker_payload: Any) -> Mapping[str, str] | None:
        """The message's attributes (``traceparent`` or ``googclient_traceparent``)."""
        attributes = raw_event.attributes
        return carrier_of(attributes) if attributes else None

    @property
    def messaging_attributes(self) -> Mapping[str, str]:
        """``gcp_pubsub`` and the subscription (the consumer group is the subscription too)."""
        return {"messaging.system": "gcp_pubsub",
                "messaging.destination.name": self.subscription,
                "messaging.consumer.group.name": self.subscription}

    async def advance(self, batch: Sequence[AdvanceItem]) -> None:
        """Ack, nack or dead-letter each message of one lane's resolved prefix.

        Raises only when the client is broken (a worker failed for good);
        per-message problems are logged with the message id.
        """
        if self._workers.broken is not None:
            raise PubSubRequestError(f"the Pub/Sub client is broken: {self._workers.broken}")
        self._in_flight.release(len(batch))
        acks, nacks, dispose = self._sort(batch)
        if nacks:
            await self._nack(nacks)
        if dispose:
            await self._dispose(dispose)
        if acks:
            await self._acks.put(acks)

    def _sort(self, batch: Sequence[AdvanceItem]) -> tuple[
        list[PubSubPayload], list[PubSubPayload], list[Disposal]
    ]:
        """Split a batch into acks, nacks and dead letters; stop every lease first.

        A key lane's first failed message becomes its *floor*: the key's
        later messages are nacked behind it, uncounted, so they come again
        after it, in order. Synchronous, so renewal of every item stops
        before anything is awaited.
        """
        acks: list[PubSubPayload] = []
        nacks: list[PubSubPayload] = []
        dispose: list[Disposal] = []
        place = self._floors.place
        for payload, outcome in batch:
            self._settle_lease(payload.ack_id)
            lane = payload.lane
            where = place(lane, payload.message_id, outcome, ordered=lane[0] == "key")
            if where == SETTLE:
                acks.append(payload)
            elif where in (AGAIN, BOUNCE):
                nacks.append(payload)
            elif where == POISON:
                dispose.append((payload, REASON_MAX_REDELIVERIES, outcome.verdicts))
            elif where == REJECTED:
                dispose.append((payload, REASON_REJECTED, outcome.verdicts))
            # else LEAVE: fanned out to nobody: its lease lapses and Pub/Sub redelivers it
        return acks, nacks, dispose

    def _settle_lease(self, ack_id: str) -> None:
        self._leases.settle(ack_id)
        self._arrived.pop(ack_id, None)

    def _forget_leases(self, ack_ids: list[str]) -> None:
        for ack_id in ack_ids:
            self._arrived.pop(ack_id, None)

    # -- deadlines -----------------------------------------------------------------------

    async def _nack(self, payloads: list[PubSubPayload]) -> None:
        """Hand ``payloads`` back (deadline 0), their leases no longer renewed.

        Most come from ``advance`` (renewal already stopped); a dead letter
        that could not be kept - a poison message on arrival, say - comes
        here straight from the stream, still renewed until now.
        """
        for payload in payloads:
            self._settle_lease(payload.ack_id)
        log.info("nacking messages", subscription=self.subscription, count=len(payloads),
                 message_ids=[p.message_id for p in payloads])
        async with self._deadlines:
            for start in range(0, len(payloads), ACK_BATCH):
                await self._modify([p.ack_id for p in payloads[start:start + ACK_BATCH]], 0)

    async def _renew(self, ack_ids: Sequence[str]) -> list[str]:
        """The lease keeper's renewal (under the deadline lock), up to ``max_lease_duration``."""
        now, limit = self._leases.now(), self.settings.max_lease_duration
        due = [a for a in ack_ids if now - self._arrived.get(a, now) < limit]
        if len(due) < len(ack_ids):
            log.warning("leases reached max_lease_duration; Pub/Sub redelivers them",
                        subscription=self.subscription, count=len(ack_ids) - len(due),
                        limit_s=limit)
        if not due:
            return []
        return await self._modify(due, self.settings.ack_deadline)

    async def _modify(self, ack_ids: list[str], seconds: int) -> list[str]:
        """One ``ModifyAckDeadline``; the ack ids it changed. Failures are logged, not raised.

        A deadline that was not changed lapses on its own: the message is
        redelivered, which costs a duplicate at most.
        """
        exceptions = SDK("google.api_core.exceptions")
        request = raw_request(SDK("google.pubsub_v1.types").ModifyAckDeadlineRequest,
                              subscription=self.subscription, ack_ids=ack_ids,
                              ack_deadline_seconds=seconds)
        try:
            await self._call("ModifyAckDeadline", lambda: self._subscriber.modify_ack_deadline(
                request=request, retry=None, timeout=_CALL_TIMEOUT))
        except PubSubProducerError as exc:
            failures = ack_failures(exc.__cause__) if isinstance(
                exc.__cause__, exceptions.GoogleAPICallError) else None
            if failures is None:
                log.warning("changing ack deadlines failed; they lapse on their own",
                            subscription=self.subscription, count=len(ack_ids), error=exc)
                return []
            return [a for a in ack_ids if a not in failures]
        return ack_ids

    # -- acks ----------------------------------------------------------------------------

    async def _send_acks(self, chunk: Sequence[PubSubPayload]) -> list[tuple[PubSubPayload, str]]:
        """One ``Acknowledge``; returns the ack ids an exactly-once subscription failed briefly.

        Raises :class:`PubSubRequestError` when the call itself failed
        transiently (the sender retries the batch), :class:`PubSubConfigError`
        when it cannot succeed (the poll ends).
        """
        exceptions = SDK("google.api_core.exceptions")
        request = raw_request(SDK("google.pubsub_v1.types").AcknowledgeRequest,
                              subscription=self.subscription, ack_ids=[p.ack_id for p in chunk])
        self.calls.count("Acknowledge")
        try:
            await self._subscriber.acknowledge(request=request, retry=None, timeout=_CALL_TIMEOUT)
        except exceptions.GoogleAPICallError as exc:
            failures = ack_failures(exc)
            if failures is None:
                if transient(exc):
                    raise PubSubRequestError(f"Acknowledge failed: {exc}") from exc
                error = sdk_error(f"Acknowledge on {self.subscription}", exc, exceptions)
                if isinstance(error, PubSubConfigError):
                    raise error from exc
                for payload in chunk:
                    _ack_lost(payload, str(exc))
                return []
            retry = []
            for payload in chunk:
                status = failures.get(payload.ack_id)
                if status is None:
                    continue
                if status.startswith("TRANSIENT_"):
                    retry.append((payload, status))
                else:
                    _ack_lost(payload, status)
            return retry
        return []

    # -- dead letters --------------------------------------------------------------------

    async def _dispose(self, items: list[Disposal]) -> None:
        """Dead-letter ``items``, acking each once its copy is kept (:class:`PubSubDeadLetters`).

        To ``dead_letter_topic``, else (none, or Pub/Sub refuses the copy
        for good) to the engine's ``dead_letter_fallback``, else discarded
        with a warning. A copy that could not be kept leaves the message
        nacked: it comes again.
        """
        await self._dead_letters.dispose(items, topic=self.settings.dead_letter_path,
                                         publisher=self._publisher)

    async def _ack_disposed(self, payloads: list[PubSubPayload]) -> None:
        for payload in payloads:
            self._settle_lease(payload.ack_id)
            self._floors.forget(payload.lane, payload.message_id)
        await self._acks.put(payloads)

    # -- re-driving ----------------------------------------------------------------------

    def replay_source(self) -> None:
        """Refused: a seek moves the whole subscription, not one watcher's view of it."""
        raise ReplayError(
            "Pub/Sub cannot replay one watcher: a seek rewinds the whole subscription (every "
            "watcher of it, and the live stream). Give the watcher a subscription of its own "
            "and seek that one")

    async def republish(self, letters: Sequence[DeadLetter]) -> None:
        """Publish kept dead letters again to the subscription's topic, as new messages.

        Outside any poll, on clients of its own (closed before this
        returns). The topic is read with ``GetSubscription``; every
        subscription of it gets the copies. Data and attributes as kept, in
        order, no ordering key (none is kept); a header that is not UTF-8
        refuses the call, nothing published. Raises
        :class:`PubSubRepublishError` for that and for a ``Publish`` that
        failed after the retry policy (earlier calls are published), and
        :class:`PubSubConfigError` for a missing subscription or topic. See
        :mod:`sharedstream.producers._pubsub_republish`.
        """
        await republish_messages(letters, settings=self.settings, calls=self.calls, sdk=SDK,
                                 clients=lambda: self._clients(publisher=True))

    # -- closing -------------------------------------------------------------------------

    async def aclose(self) -> None:
        """Flush queued acks (10 s at most), stop the workers and the clients, once."""
        if self._closed:
            return
        self._closed = True
        try:
            await self._acks.flush(10)
        finally:
            await self._workers.stop()
            if self._acks.queued:
                log.warning("acks not sent before closing; those messages come again and "
                            "their events are skipped as duplicates",
                            subscription=self.subscription, count=self._acks.queued)
            if self._claimed:
                _consumed.release(self.settings.identity(), self.settings.fingerprint())
            for client in (self._subscriber, self._publisher):
                if client is not None:
                    close: Callable[[], Awaitable[None]] = client.transport.close
                    await close()


def _ack_lost(payload: PubSubPayload, detail: str) -> None:
    log.warning("ack did not take; Pub/Sub redelivers the message and its events are skipped "
                "as duplicates", message_id=payload.message_id, error=detail)
