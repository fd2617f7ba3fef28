"""Amazon SQS: one receiving client shared by every trigger of a queue (ack mode).

:class:`SqsSharedStreamProducer` talks to SQS with ``aiobotocore`` (the
``sqs`` extra: ``pip install 'sharedstream[sqs]'``) and maps each advanced
outcome to a broker action:

* **clean** (acked, nobody failed or rejected) - delete it. Deletes are
  queued and sent by ``delete_concurrency`` background senders with
  ``DeleteMessageBatch`` in chunks of 10, never one call per message (the
  kit's settle sender); ``advance`` returns once they are queued (the
  events are already stored: a crash before the delete only redelivers the
  message, and the store skips its events).
* **rejected** - send a copy to ``dead_letter_queue`` (original body and
  attributes, plus ``sharedstream.*`` attributes naming the source queue,
  message id, reason and receive count), then delete it once the send is
  acknowledged; without a dead-letter queue, delete it with a warning.
* **failed** - set its visibility to the failure backoff
  (``failure_visibility`` seconds, doubled per earlier failure; 0 by
  default: redelivered at once), unless it has now failed more than
  ``max_redeliveries`` times: then it is dead-lettered (or discarded).
* **fanned out to nobody** - left alone: its visibility lapses and it is
  received again.

While a message is outstanding its visibility is renewed in batches
(``ChangeMessageVisibilityBatch``, chunks of 10) once half of the
visibility timeout has passed; renewal stops the moment it is advanced.

**Lanes.** A FIFO queue's lane is the ``MessageGroupId``: the group's order
is kept, and a failed message holds its group (the *floor*): the group's
later messages are made visible again behind it, not deleted, so they are
redelivered after it, in order. A standard queue has no order to keep; its
lane is the receive call the message came in, so one slow message holds
back the deletes of at most its own receive batch (10 messages), and a
ready lane is one ``DeleteMessageBatch`` of up to 10 entries.

**Back-pressure.** Up to ``receive_concurrency`` long-polling receives run
at once, each only while ``max_in_flight`` leaves room for a full receive:
messages received but not yet advanced are what fills the subscribers'
queues, so when subscribers fall behind no receive is made at all.

**Outages.** A receive that got no answer (SQS unreachable, botocore's
retries spent) is tried again after the retry policy's delays (``retries``,
``retry_backoff``) before the poll ends; meanwhile :attr:`connected` is
``False``, which fails the runtime's readiness check.

Two triggers with different consumer settings on one queue would be two
competing consumers, each message reaching only one of them: a second
producer for a queue already consumed in this process with other settings
is refused (:class:`SqsConfigError`).

The plumbing is the broker kit's (:mod:`sharedstream.brokerkit`): the lazy
SDK import, the retry policy, the in-flight limit, the dead-letter desk and
its fallback, the redelivery rule, the lease keeper (visibility renewal),
the settle sender (deletes), batching and settings claims. What is here is SQS's: the calls,
taking what arrives, deleting and re-showing; the client is made in
:mod:`~sharedstream.producers._sqs_client`, the receive loop runs in
:mod:`~sharedstream.producers._sqs_receive`, visibility is changed in
:mod:`~sharedstream.producers._sqs_visibility`, dead letters sent in
:mod:`~sharedstream.producers._sqs_deadletters`.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Hashable,
    Mapping,
    Sequence,
)
from typing import Any

from sharedstream.brokerkit.calls import BrokerCalls
from sharedstream.brokerkit.deadletters import (
    REASON_MAX_REDELIVERIES,
    REASON_REJECTED,
    DeadLetterDesk,
)
from sharedstream.brokerkit.fingerprints import SourceClaims
from sharedstream.brokerkit.inflight import InFlightLimit
from sharedstream.brokerkit.lease import LeaseKeeper
from sharedstream.brokerkit.redelivery import DeliveryTally, PoisonCheck, RedeliveryPolicy
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
from sharedstream.producers._sqs_backlog import queue_backlog
from sharedstream.producers._sqs_client import SDK, sqs_client
from sharedstream.producers._sqs_deadletters import Disposal, SqsDeadLetters
from sharedstream.producers._sqs_receive import SqsReceiver
from sharedstream.producers._sqs_republish import (
    SqsRepublishError,
    dead_letter_message,
    republish_messages,
)
from sharedstream.producers._sqs_types import (
    BATCH,
    DLQ_ATTRIBUTE_DETAIL,
    DLQ_ATTRIBUTE_MESSAGE_ID,
    DLQ_ATTRIBUTE_QUEUE,
    DLQ_ATTRIBUTE_REASON,
    DLQ_ATTRIBUTE_RECEIVE_COUNT,
    DLQ_ATTRIBUTE_TRIGGERS,
    MAX_BATCH_BYTES,
    OPERATIONS,
    SqsConfigError,
    SqsDeadLetterError,
    SqsMessage,
    SqsPayload,
    SqsProducerError,
    SqsRequestError,
    SqsSettings,
    queue_name,
    sdk_error,
    sized_chunks,
)
from sharedstream.producers._sqs_visibility import (
    CONCURRENT_BATCHES,
    Lease,
    SqsVisibility,
    leases_of,
)

__all__ = [
    "DLQ_ATTRIBUTE_DETAIL",
    "DLQ_ATTRIBUTE_MESSAGE_ID",
    "DLQ_ATTRIBUTE_QUEUE",
    "DLQ_ATTRIBUTE_REASON",
    "DLQ_ATTRIBUTE_RECEIVE_COUNT",
    "DLQ_ATTRIBUTE_TRIGGERS",
    "MAX_BATCH_BYTES",
    "SqsConfigError",
    "SqsDeadLetterError",
    "SqsMessage",
    "SqsPayload",
    "SqsProducerError",
    "SqsRepublishError",
    "SqsRequestError",
    "SqsSettings",
    "SqsSharedStreamProducer",
    "queue_name",
    "sqs_client",
]

log = key_value_logger(__name__)

_MAX_HOLDS = 4096

_sized_chunks = sized_chunks  # its name before it moved to the types module

_consumed = SourceClaims()
"""Queues consumed in this process, and the settings fingerprint consuming each."""


class SqsSharedStreamProducer(SharedStreamProducer):
    """The SQS side of a shared stream; see the module docstring for the policy.

    The constructor validates (raising :class:`SqsConfigError`, a
    ``ValueError``, also when the ``sqs`` extra is not installed) and
    connects to nothing. ``calls`` counts the API calls
    made, by operation (also reported as the OpenTelemetry counter
    ``sharedstream.broker.requests``).
    """

    counts_deliveries = True  # ApproximateReceiveCount: the store judges a suspect

    def __init__(self, settings: SqsSettings) -> None:
        settings.validate()
        SDK("aiobotocore.session")  # a missing extra is a clear error here, not at connect
        self.settings = settings
        self.calls = BrokerCalls("sqs")
        self._letters = DeadLetterDesk(self, setting="dead_letter_queue", logger=log)
        self._client: Any = None
        self._exit = contextlib.AsyncExitStack()
        self._url = ""
        self._dlq_url: str | None = None
        self._fifo = False
        self._claimed = False
        self._closed = False
        self._visibility = SqsVisibility(call=self._call, logger=log)
        self._leases: LeaseKeeper[Lease] = LeaseKeeper(
            self._renew, lease=settings.visibility_timeout, batch_size=BATCH,
            concurrency=CONCURRENT_BATCHES, guard=self._visibility.lock)
        # Received (or being received) and not yet advanced.
        self._in_flight = InFlightLimit(settings.max_in_flight)
        self._redelivery = RedeliveryPolicy(settings.max_redeliveries)
        self._poison = PoisonCheck(self._redelivery, self, logger=log)
        self._dead_letters = SqsDeadLetters(call=self._call, letters=self._letters,
                                            delete=self._queue_deletes, logger=log)
        # Bounded (two rounds of the senders): a message waiting here is no longer renewed,
        # so when deletes back up, advance waits (and receiving pauses behind it).
        self._deletes: SettleSender[SqsPayload] = SettleSender(
            self._send_deletes, batch_size=BATCH, senders=settings.delete_concurrency,
            policy=settings.retry_policy(), retry_on=SqsRequestError,
            on_given_up=_delete_refused)
        # The receivers, the delete senders and the renewals; one batch per receive call.
        # A sender gone for good must not leave advance waiting on it.
        self._workers: PollWorkers[SqsPayload] = PollWorkers(
            on_broken=(self._deletes.interrupt,))
        self._floors: dict[Hashable, str] = {}  # lane -> message id holding it
        # Message id -> receives that were not failures of its own.
        self._bounced: DeliveryTally[str] = DeliveryTally(_MAX_HOLDS)
        # Message id -> failures of its own in this process (a receive count also counts the
        # receives a killed triggerer held; the store's count judges those: see _take).
        self._failures: DeliveryTally[str] = DeliveryTally(_MAX_HOLDS)
        self._receive_ids = itertools.count()
        self._receiver = SqsReceiver(settings, call=self._call, take=self._take,
                                     in_flight=self._in_flight, clock=self._leases.now,
                                     logger=log)

    @property
    def discarded(self) -> int:
        """Messages dropped: no dead-letter queue and no fallback."""
        return self._letters.discarded

    # -- connection ----------------------------------------------------------------------

    async def _call(self, operation: str, **kwargs: Any) -> dict[str, Any]:
        """One SQS API call (counted), its SDK errors wrapped (see :func:`sdk_error`)."""
        method: Callable[..., Awaitable[dict[str, Any]]] = getattr(
            self._client, OPERATIONS[operation])
        self.calls.count(operation)
        exceptions = SDK("botocore.exceptions")
        try:
            return await method(**kwargs)
        except (exceptions.ClientError, exceptions.BotoCoreError) as exc:
            queue = kwargs.get("QueueUrl") or kwargs.get("QueueName")
            where = f"{operation} on {queue}" if queue else operation
            raise sdk_error(where, exc, exceptions) from exc

    def _new_client(self) -> contextlib.AbstractAsyncContextManager[Any]:
        """An SQS client of these settings: see :func:`sqs_client`."""
        return sqs_client(self.settings)

    async def _connect(self) -> None:
        s = self.settings
        self._client = await self._exit.enter_async_context(self._new_client())
        self._url = await self._resolve(s.queue)
        if s.dead_letter_queue is not None:
            self._dlq_url = await self._resolve(s.dead_letter_queue)
        self._fifo = self._url.endswith(".fifo")

    async def _resolve(self, queue: str) -> str:
        if queue.startswith(("http://", "https://")):
            return queue
        return str((await self._call("GetQueueUrl", QueueName=queue))["QueueUrl"])

    def _claim(self) -> None:
        identity = self.settings.identity()
        if not _consumed.claim(identity, self.settings.fingerprint()):
            raise SqsConfigError(
                f"queue {identity[2]!r} is already consumed in this process with other "
                "settings; every trigger of one queue must use the same receive, visibility, "
                "dead-letter and credential settings (two consumers would split its messages)"
            )
        self._claimed = True

    # -- the poll ------------------------------------------------------------------------

    async def open_stream(self) -> AsyncIterator[tuple[Any, Any]]:
        """Connect, start the receivers, and yield ``(SqsMessage, SqsPayload)`` pairs."""
        self._claim()
        await self._connect()
        # A worker's error ends the poll (the group restarts); what was received and not
        # advanced lapses back to visible, so nothing is lost.
        self._workers.start(f"sqs {queue_name(self._url)}", [
            *((f"receive-{i}", lambda: self._receiver.run(self._url))
              for i in range(self.settings.receive_concurrency)),
            ("delete", self._deletes.run),
            ("renew", self._leases.run),
        ])
        async for batch in self._workers.batches():
            for payload in batch:
                yield payload.message, payload

    async def _take(self, received: list[dict[str, Any]], deadline: float) -> None:
        batch_lane = next(self._receive_ids)
        arrived: list[SqsPayload] = []
        suspects: dict[int, tuple[str | None, int]] = {}
        for raw in received:
            message = SqsMessage(self._url, raw)
            lane: Hashable = ("group", message.group_id) if self._fifo else batch_lane
            payload = SqsPayload(message.message_id, raw["ReceiptHandle"], lane, message)
            deliveries = message.receive_count - self._bounced.get(message.message_id)
            if self._redelivery.poisoned_on_arrival(deliveries):
                # Delivered that often without resolving: the store says whether it is poison.
                suspects[len(arrived)] = (message.message_id, message.receive_count)
            arrived.append(payload)
        taken, poison = await self._poison.split(arrived, suspects)
        for payload in taken:
            self._leases.hold((payload.receipt_handle, payload.message_id), deadline)
        if taken:
            self._workers.put(taken)
        if poison:  # failed too often itself: never fan it out again
            self._in_flight.release(len(poison))
            await self._dispose([(payload, REASON_MAX_REDELIVERIES, ()) for payload in poison])

    # -- the engine's calls --------------------------------------------------------------

    @property
    def connected(self) -> bool | None:
        """How the last ``ReceiveMessage`` went: SQS is plain HTTP, with no connection to watch.

        ``None`` until a receive returned or failed (a long poll may take
        ``wait_time_seconds``); ``True`` once one returned; ``False`` from a
        receive that got no answer (botocore's retries spent) until one
        returns again, through the receive loop's own retries, and after
        one that failed for good. With several receivers the last to finish
        decides.
        """
        return self._receiver.receiving

    async def broker_backlog(self) -> BrokerBacklog:
        """The queue's message counts (:mod:`sharedstream.producers._sqs_backlog`)."""
        if self._client is None or not self._url:
            raise SqsRequestError("the SQS client is not open")
        return await queue_backlog(self._call, self._url, self._dlq_url)

    def get_advance_lane(self, broker_payload: Any) -> Hashable:
        """The ``MessageGroupId`` on a FIFO queue, the receive call on a standard one."""
        lane: Hashable = broker_payload.lane
        return lane

    def raw_event_name(self, broker_payload: Any) -> str | None:
        """The SQS message id: the same for every redelivery of a message."""
        return str(broker_payload.message_id)

    def trace_carrier(self, raw_event: Any, broker_payload: Any) -> Mapping[str, str] | None:
        """The message's ``String`` attributes (``traceparent`` among them, when traced)."""
        attributes = raw_event.attributes
        return carrier_of(attributes) if attributes else None

    @property
    def messaging_attributes(self) -> Mapping[str, str]:
        """``aws_sqs`` and the queue's name."""
        return {"messaging.system": "aws_sqs",
                "messaging.destination.name": queue_name(self.settings.queue)}

    async def advance(self, batch: Sequence[AdvanceItem]) -> None:
        """Delete, dead-letter, re-show or leave each message of one lane's resolved prefix.

        Raises only when the client is broken (a delete sender gave up);
        per-message problems are logged with the message id.
        """
        if self._workers.broken is not None:
            raise SqsRequestError(f"the SQS client is broken: {self._workers.broken}")
        self._in_flight.release(len(batch))
        deletes, failed, bounced, dispose = self._sort(batch)
        if bounced:
            for payload in bounced:
                self._bounced.add(payload.message_id)
            log.debug("showing messages again behind a held message",
                      message_ids=[p.message_id for p in bounced])
            await self._set_visibility(leases_of(bounced), 0)
        if failed:
            await self._show_failed(failed)
        if dispose:
            await self._dispose(dispose)
        if deletes:
            await self._queue_deletes(deletes)

    def _sort(self, batch: Sequence[AdvanceItem]) -> tuple[
        list[SqsPayload], list[SqsPayload], list[SqsPayload], list[Disposal]
    ]:
        """Split a batch into deletes, failures, bounces and dead letters.

        A lane's first failed message becomes its *hold*. Behind a hold, a
        FIFO group's messages are all bounced (shown again uncounted, so they
        come back after it, in order); on a standard queue only failed ones
        are: they most likely failed because a subscriber died on the held
        message before pulling them, so their failure is not counted toward
        ``max_redeliveries``. Synchronous, so renewal of every item stops
        before anything is awaited.
        """
        leases, floors, fifo = self._leases, self._floors, self._fifo
        deletes: list[SqsPayload] = []
        failed: list[SqsPayload] = []
        bounced: list[SqsPayload] = []
        dispose: list[Disposal] = []
        for payload, outcome in batch:
            leases.settle((payload.receipt_handle, payload.message_id))  # renewal stops here
            message_id, lane = payload.message_id, payload.lane
            floor = floors.get(lane)
            if floor == message_id:
                del floors[lane]
            elif floor is not None and (fifo or outcome.failed):
                bounced.append(payload)
                continue
            if outcome.failed:
                if self._redelivery.counts(outcome):
                    failures = self._failures.add(message_id)
                else:
                    # Only subscribers that never had it in their filter failed (they
                    # died on another message): shown again, but not held against it.
                    self._bounced.add(message_id)
                    failures = self._failures.get(message_id)
                if self._redelivery.exhausted(failures):
                    dispose.append((payload, REASON_MAX_REDELIVERIES, outcome.verdicts))
                    continue
                failed.append(payload)
                if lane not in floors:
                    floors[lane] = message_id
                    if len(floors) > _MAX_HOLDS:  # standard lanes never come back: forget
                        del floors[next(iter(floors))]
            elif outcome.rejected:
                dispose.append((payload, REASON_REJECTED, outcome.verdicts))
            elif outcome.acked:
                deletes.append(payload)
            # else: fanned out to nobody; its visibility lapses and it is received again
        return deletes, failed, bounced, dispose

    async def _show_failed(self, failed: list[SqsPayload]) -> None:
        base = self.settings.failure_visibility
        by_delay: dict[int, list[SqsPayload]] = {}
        for payload in failed:
            earlier = payload.message.receive_count - self._bounced.get(payload.message_id) - 1
            delay = min(base * 2 ** max(earlier, 0), 43_200) if base else 0
            by_delay.setdefault(delay, []).append(payload)
        for delay, payloads in by_delay.items():
            log.info("re-showing failed messages", queue=queue_name(self._url),
                     count=len(payloads), delay_s=delay,
                     message_ids=[p.message_id for p in payloads])
            await self._set_visibility(leases_of(payloads), delay)

    # -- visibility ----------------------------------------------------------------------

    async def _set_visibility(self, leases: Sequence[Lease], seconds: int) -> list[Lease]:
        """Set the visibility of ``leases``; those that took (:meth:`SqsVisibility.show`)."""
        return await self._visibility.show(self._url, leases, seconds)

    async def _renew(self, chunk: Sequence[Lease]) -> list[Lease]:
        """The lease keeper's renewal (it holds the visibility lock): one batch of 10 at most."""
        return await self._visibility.change(self._url, chunk, self.settings.visibility_timeout)

    # -- deletes -------------------------------------------------------------------------

    async def _queue_deletes(self, payloads: list[SqsPayload]) -> None:
        floors = self._floors
        for payload in payloads:  # resolved for good: forget its bounces and any hold
            self._bounced.forget(payload.message_id)
            self._failures.forget(payload.message_id)
            if floors.get(payload.lane) == payload.message_id:
                del floors[payload.lane]
        await self._deletes.put(payloads)

    async def _send_deletes(self, chunk: Sequence[SqsPayload]) -> list[tuple[SqsPayload, str]]:
        """One ``DeleteMessageBatch``; returns what the service failed (the sender retries)."""
        entries = [{"Id": str(i), "ReceiptHandle": p.receipt_handle} for i, p in enumerate(chunk)]
        response = await self._call("DeleteMessageBatch", QueueUrl=self._url, Entries=entries)
        retry = []
        for failure in response.get("Failed") or []:
            payload = chunk[int(failure["Id"])]
            detail = f"{failure.get('Code')}: {failure.get('Message')}"
            if failure.get("SenderFault"):
                _delete_refused(payload, detail)
            else:
                retry.append((payload, detail))
        return retry

    # -- dead letters --------------------------------------------------------------------

    async def _dispose(self, items: list[Disposal]) -> None:
        """Dead-letter ``items``, deleting each once its copy is kept (:class:`SqsDeadLetters`).

        To ``dead_letter_queue``, else (none, or SQS refuses the copy for
        good) to the engine's ``dead_letter_fallback``, else discarded with a
        warning. A transient failure leaves the message where it is: it
        comes again.
        """
        await self._dead_letters.dispose(items, source=self._url, destination=self._dlq_url)

    # -- re-driving ----------------------------------------------------------------------

    async def republish(self, letters: Sequence[DeadLetter]) -> None:
        """Send kept dead letters again, each a new message of the queue (new message id).

        Outside any poll, on a client of its own (closed before this
        returns); ``SendMessageBatch``, 10 at a time, in order. The body is
        the payload as text (a payload that is not UTF-8 refuses the call,
        nothing sent); headers become ``String`` attributes, or ``Binary``
        ones when not UTF-8. On a FIFO queue the group is
        ``sharedstream-redrive`` and the deduplication id a digest of source
        and payload (a repeat within SQS's five-minute window is dropped).
        Raises :class:`SqsRepublishError` for a letter refused, or entries
        still failing after the retry policy, and the usual
        :class:`SqsRequestError` / :class:`SqsConfigError` when a call
        fails; earlier batches are sent by then. See
        :mod:`sharedstream.producers._sqs_republish`.
        """
        await republish_messages(letters, settings=self.settings, new_client=self._new_client,
                                 calls=self.calls, sdk=SDK)

    def dead_letter_event(self, letter: DeadLetter) -> tuple[Any, Any] | None:
        """The ``(SqsMessage, SqsPayload)`` a kept letter was; ``None``: its body is not text.

        For a replay of a watcher's dead letters: the message id (so
        :meth:`raw_event_name` is the live one), body and attributes as kept
        (see :func:`~sharedstream.producers._sqs_republish.dead_letter_message`);
        the payload has no receipt handle and is never advanced.
        """
        message = dead_letter_message(self.settings.queue, letter)
        if message is None:
            return None
        return message, SqsPayload(message.message_id, "", "dead-letters", message)

    # -- closing -------------------------------------------------------------------------

    async def aclose(self) -> None:
        """Flush queued deletes (10 s at most), stop the workers and the client, once."""
        if self._closed:
            return
        self._closed = True
        try:
            await self._deletes.flush(10)  # at once when broken: nothing sends
        finally:
            await self._workers.stop()
            if self._deletes.queued:
                log.warning("deletes not sent before closing; those messages come again and "
                            "their events are skipped as duplicates",
                            queue=queue_name(self._url), count=self._deletes.queued)
            if self._claimed:
                _consumed.release(self.settings.identity(), self.settings.fingerprint())
            await self._exit.aclose()


def _delete_refused(payload: SqsPayload, detail: str) -> None:
    log.warning("delete refused; the message is redelivered and its events skipped as "
                "duplicates", message_id=payload.message_id, error=detail)
