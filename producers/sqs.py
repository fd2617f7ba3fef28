"""Amazon SQS: one receiving client shared by every trigger of a queue (ack mode).

:class:`SqsSharedStreamProducer` talks to SQS with ``aiobotocore`` (the
``sqs`` extra: ``pip install 'sharedstream[sqs]'``) and maps each advanced
outcome to a broker action:

* **clean** (acked, nobody failed or rejected) - delete it. Deletes are
  queued and sent by a few background senders with ``DeleteMessageBatch``
  in chunks of 10, never one call per message; ``advance`` returns once
  they are queued (the events are already stored: a crash before the
  delete only redelivers the message, and the store skips its events).
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

Two triggers with different consumer settings on one queue would be two
competing consumers, each message reaching only one of them: a second
producer for a queue already consumed in this process with other settings
is refused (:class:`SqsConfigError`).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import itertools
import logging
from collections import Counter, deque
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable, Sequence
from types import ModuleType
from typing import Any

from opentelemetry import metrics

from sharedstream import __version__
from sharedstream.engine.producer import (
    AdvanceItem,
    DeadLetter,
    SharedStreamProducer,
    Verdict,
    verdict_detail,
    verdict_triggers,
)
from sharedstream.producers._sqs_types import (
    BATCH,
    DLQ_ATTRIBUTE_DETAIL,
    DLQ_ATTRIBUTE_MESSAGE_ID,
    DLQ_ATTRIBUTE_QUEUE,
    DLQ_ATTRIBUTE_REASON,
    DLQ_ATTRIBUTE_RECEIVE_COUNT,
    DLQ_ATTRIBUTE_TRIGGERS,
    REASON_MAX_REDELIVERIES,
    REASON_REJECTED,
    SqsConfigError,
    SqsDeadLetterError,
    SqsMessage,
    SqsPayload,
    SqsProducerError,
    SqsRequestError,
    SqsSettings,
    queue_name,
)

__all__ = [
    "DLQ_ATTRIBUTE_DETAIL",
    "DLQ_ATTRIBUTE_MESSAGE_ID",
    "DLQ_ATTRIBUTE_QUEUE",
    "DLQ_ATTRIBUTE_REASON",
    "DLQ_ATTRIBUTE_RECEIVE_COUNT",
    "DLQ_ATTRIBUTE_TRIGGERS",
    "SqsConfigError",
    "SqsDeadLetterError",
    "SqsMessage",
    "SqsPayload",
    "SqsProducerError",
    "SqsRequestError",
    "SqsSettings",
    "SqsSharedStreamProducer",
    "queue_name",
]

log = logging.getLogger(__name__)

_SQS_MAX_ATTRIBUTES = 10
_MAX_HOLDS = 4096
_SYSTEM_ATTRIBUTES = ["ApproximateReceiveCount", "SentTimestamp", "MessageGroupId"]
"""The system attributes read (all of them cost parsing time on every receive)."""
_CONCURRENT_BATCHES = 8
_requests = metrics.get_meter("sharedstream.sqs").create_counter(
    "sharedstream.broker.requests",
    unit="{request}",
    description="Broker API calls made by producers, by broker and operation",
)


class _Held:
    """Visibility bookkeeping of one outstanding message."""

    __slots__ = ("deadline", "message_id")

    def __init__(self, deadline: float, message_id: str) -> None:
        self.deadline, self.message_id = deadline, message_id


def _sdk(name: str) -> ModuleType:
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise SqsConfigError(
            "the SQS producer needs aiobotocore: pip install 'sharedstream[sqs]'"
        ) from exc


def _handles(payloads: Sequence[SqsPayload]) -> list[tuple[str, str]]:
    return [(p.receipt_handle, p.message_id) for p in payloads]


_OUR_ATTRIBUTES = frozenset({
    DLQ_ATTRIBUTE_QUEUE, DLQ_ATTRIBUTE_MESSAGE_ID, DLQ_ATTRIBUTE_REASON,
    DLQ_ATTRIBUTE_RECEIVE_COUNT, DLQ_ATTRIBUTE_TRIGGERS, DLQ_ATTRIBUTE_DETAIL,
})


def _attribute_bytes(value: dict[str, Any]) -> bytes:
    """A message attribute's value as bytes (String and Number as UTF-8, Binary as is)."""
    data = value.get("BinaryValue")
    if isinstance(data, bytes):
        return data
    return str(value.get("StringValue", "")).encode("utf-8", "surrogatepass")


_Disposal = tuple[SqsPayload, str, Sequence[Verdict]]
"""A message to dead-letter, why (``rejected``, ``max_redeliveries``), and who said what."""


def _detail(verdicts: Sequence[Verdict], prefix: str) -> str:
    """What the verdicts say after ``prefix`` (empty when they say nothing)."""
    said = verdict_detail(verdicts)
    return f"{prefix}{said}" if said else ""


def _chunks(items: Sequence[Any], size: int = BATCH) -> list[Sequence[Any]]:
    return [items[i:i + size] for i in range(0, len(items), size)]


MAX_BATCH_BYTES = 1024 * 1024
"""SendMessageBatch's limit on the sum of its entries' bodies and attributes."""


def _entry_bytes(entry: dict[str, Any]) -> int:
    """What one SendMessageBatch entry counts toward ``MAX_BATCH_BYTES``."""
    size = len(entry["MessageBody"].encode("utf-8", "surrogatepass"))
    for name, value in entry.get("MessageAttributes", {}).items():
        data = value.get("StringValue") or value.get("BinaryValue") or ""
        size += len(name) + len(value["DataType"]) + (
            len(data) if isinstance(data, bytes) else len(data.encode("utf-8", "surrogatepass")))
    return size


_Entry = tuple[Any, dict[str, Any]]
"""Something to send, and its SendMessageBatch entry."""


def _sized_chunks(pairs: list[_Entry]) -> list[list[_Entry]]:
    """``(item, entry)`` pairs in batches of at most ``BATCH`` entries and ``MAX_BATCH_BYTES``."""
    chunks: list[list[_Entry]] = []
    size = 0
    for pair in pairs:
        grow = _entry_bytes(pair[1])
        if not chunks or len(chunks[-1]) >= BATCH or size + grow > MAX_BATCH_BYTES:
            chunks.append([])
            size = 0
        chunks[-1].append(pair)
        size += grow
    return chunks


_consumed: dict[tuple[str, str | None, str], str] = {}
"""Queues consumed in this process -> the settings fingerprint consuming them."""


class SqsSharedStreamProducer(SharedStreamProducer):
    """The SQS side of a shared stream; see the module docstring for the policy.

    The constructor validates (raising :class:`SqsConfigError`, a
    ``ValueError``, also when the ``sqs`` extra is not installed) and
    connects to nothing. ``calls`` counts the API calls
    made, by operation (also reported as the OpenTelemetry counter
    ``sharedstream.broker.requests``).
    """

    def __init__(self, settings: SqsSettings) -> None:
        settings.validate()
        _sdk("aiobotocore.session")  # a missing extra is a clear error here, not at connect
        self.settings = settings
        self.calls: Counter[str] = Counter()
        self.dead_lettered = 0
        self.discarded = 0
        self._refusals: dict[str, str] = {}  # message id -> why the DLQ refused it
        self._client: Any = None
        self._exit = contextlib.AsyncExitStack()
        self._url = ""
        self._dlq_url: str | None = None
        self._fifo = False
        self._claimed = False
        self._closed = False
        # One entry per receive call (not per message), or the error that ends the poll.
        self._inbox: asyncio.Queue[list[SqsPayload] | BaseException] = asyncio.Queue()
        self._tasks: list[asyncio.Task[None]] = []
        self._held: dict[str, _Held] = {}  # receipt handle -> visibility
        self._in_flight = 0  # received (or being received) and not yet advanced
        self._capacity = asyncio.Event()
        self._capacity.set()
        self._visibility = asyncio.Lock()  # renewals and re-shows never race each other
        self._deletes: deque[SqsPayload] = deque()
        self._deletes_waiting = asyncio.Event()
        self._deletes_drained = asyncio.Event()
        self._deletes_room = asyncio.Event()
        self._deleting = 0
        self._delete_backlog = settings.delete_concurrency * BATCH * 2
        self._broken: BaseException | None = None
        self._floors: dict[Hashable, str] = {}  # lane -> message id holding it
        self._bounced: dict[str, int] = {}  # message id -> receives that were not failures
        self._receive_ids = itertools.count()

    # -- connection ----------------------------------------------------------------------

    async def _call(self, operation: str, **kwargs: Any) -> dict[str, Any]:
        """One SQS API call (counted), its errors wrapped in :class:`SqsRequestError`."""
        method: Callable[..., Awaitable[dict[str, Any]]] = getattr(
            self._client, _SNAKE[operation])
        self.calls[operation] += 1
        _requests.add(1, {"broker": "sqs", "operation": operation})
        exceptions = _sdk("botocore.exceptions")
        try:
            return await method(**kwargs)
        except exceptions.NoCredentialsError as exc:
            raise SqsConfigError(
                f"no AWS credentials for {operation}: set the trigger's credentials or the "
                "usual AWS environment variables"
            ) from exc
        except exceptions.ClientError as exc:
            error = exc.response.get("Error", {})
            code = error.get("Code", "")
            if "NonExistentQueue" in code or code == "QueueDoesNotExist":
                raise SqsConfigError(f"{operation}: queue does not exist ({exc})") from exc
            raise SqsRequestError(f"{operation} failed: {exc}", code=code,
                                  sender_fault=error.get("Type") == "Sender") from exc
        except exceptions.BotoCoreError as exc:
            raise SqsRequestError(f"{operation} failed: {exc}") from exc

    async def _connect(self) -> None:
        s = self.settings
        session = _sdk("aiobotocore.session").get_session()
        config = _sdk("aiobotocore.config").AioConfig(
            connect_timeout=5,
            read_timeout=s.wait_time_seconds + 10,
            retries={"mode": "standard", "max_attempts": s.retries},
            max_pool_connections=s.receive_concurrency + s.delete_concurrency + 4,
            # Two per-request costs the SDK pays in Python on every call, about a
            # fifth of its CPU per call together: checking the request against
            # the model (ours are built here from validated settings) and
            # rebuilding the User-Agent header twice (a fixed one instead).
            parameter_validation=False,
            user_agent=f"sharedstream/{__version__} aiobotocore/{_sdk('aiobotocore').__version__}",
        )
        self._client = await self._exit.enter_async_context(session.create_client(
            "sqs", region_name=s.region_name, endpoint_url=s.endpoint_url, config=config,
            **dict(s.credentials),
        ))
        self._url = await self._resolve(s.queue)
        if s.dead_letter_queue is not None:
            self._dlq_url = await self._resolve(s.dead_letter_queue)
        self._fifo = self._url.endswith(".fifo")

    async def _resolve(self, queue: str) -> str:
        if queue.startswith(("http://", "https://")):
            return queue
        return str((await self._call("GetQueueUrl", QueueName=queue))["QueueUrl"])

    def _claim(self) -> None:
        identity, mine = self.settings.identity(), self.settings.fingerprint()
        theirs = _consumed.get(identity)
        if theirs is not None and theirs != mine:
            raise SqsConfigError(
                f"queue {identity[2]!r} is already consumed in this process with other "
                "settings; every trigger of one queue must use the same receive, visibility, "
                "dead-letter and credential settings (two consumers would split its messages)"
            )
        _consumed[identity] = mine
        self._claimed = True

    # -- the poll ------------------------------------------------------------------------

    async def open_stream(self) -> AsyncIterator[tuple[Any, Any]]:
        """Connect, start the receivers, and yield ``(SqsMessage, SqsPayload)`` pairs."""
        self._claim()
        await self._connect()
        workers: list[tuple[str, Callable[[], Awaitable[None]]]] = [
            *((f"receive-{i}", self._receive_loop)
              for i in range(self.settings.receive_concurrency)),
            *((f"delete-{i}", self._delete_loop)
              for i in range(self.settings.delete_concurrency)),
            ("renew", self._renew_loop),
        ]
        for name, work in workers:
            self._tasks.append(asyncio.get_running_loop().create_task(
                self._guard(work), name=f"sqs {queue_name(self._url)} {name}"))
        inbox = self._inbox
        while True:
            item = await inbox.get()
            if isinstance(item, BaseException):
                raise item
            for payload in item:
                yield payload.message, payload

    async def _guard(self, work: Callable[[], Awaitable[None]]) -> None:
        # A worker's error ends the poll through the inbox (the group restarts); what was
        # received and not advanced lapses back to visible, so nothing is lost.
        try:
            await work()
        except Exception as exc:  # noqa: BLE001 - handed to the poll, which raises it
            self._broken = exc
            self._deletes_room.set()  # nobody waits on a sender that is gone
            self._inbox.put_nowait(exc)

    async def _receive_loop(self) -> None:
        s = self.settings
        loop = asyncio.get_running_loop()
        while True:
            while self._in_flight + s.max_messages > s.max_in_flight:
                self._capacity.clear()
                await self._capacity.wait()
            self._in_flight += s.max_messages  # reserve room for a full receive
            started = loop.time()
            try:
                response = await self._call(
                    "ReceiveMessage", QueueUrl=self._url, MaxNumberOfMessages=s.max_messages,
                    WaitTimeSeconds=s.wait_time_seconds, VisibilityTimeout=s.visibility_timeout,
                    AttributeNames=_SYSTEM_ATTRIBUTES,
                    MessageSystemAttributeNames=_SYSTEM_ATTRIBUTES,
                    MessageAttributeNames=["All"],
                )
            finally:
                self._release(s.max_messages)
            received = response.get("Messages") or []
            self._in_flight += len(received)
            await self._take(received, started + s.visibility_timeout)

    async def _take(self, received: list[dict[str, Any]], deadline: float) -> None:
        batch_lane = next(self._receive_ids)
        poison: list[_Disposal] = []
        taken: list[SqsPayload] = []
        for raw in received:
            message = SqsMessage(self._url, raw)
            lane: Hashable = ("group", message.group_id) if self._fifo else batch_lane
            payload = SqsPayload(message.message_id, raw["ReceiptHandle"], lane, message)
            deliveries = message.receive_count - self._bounced.get(message.message_id, 0)
            if deliveries > self.settings.max_redeliveries + 1:
                # Delivered that often without resolving (crashes, lapses): never fan it out.
                self._release(1)
                poison.append((payload, REASON_MAX_REDELIVERIES, ()))
                continue
            self._held[payload.receipt_handle] = _Held(deadline, message.message_id)
            taken.append(payload)
        if taken:
            self._inbox.put_nowait(taken)
        if poison:
            await self._dispose(poison)

    def _release(self, count: int) -> None:
        self._in_flight = max(0, self._in_flight - count)
        if self._in_flight + self.settings.max_messages <= self.settings.max_in_flight:
            self._capacity.set()

    # -- the engine's calls --------------------------------------------------------------

    def get_advance_lane(self, broker_payload: Any) -> Hashable:
        """The ``MessageGroupId`` on a FIFO queue, the receive call on a standard one."""
        lane: Hashable = broker_payload.lane
        return lane

    def raw_event_name(self, broker_payload: Any) -> str | None:
        """The SQS message id: the same for every redelivery of a message."""
        return str(broker_payload.message_id)

    async def advance(self, batch: Sequence[AdvanceItem]) -> None:
        """Delete, dead-letter, re-show or leave each message of one lane's resolved prefix.

        Raises only when the client is broken (a delete sender gave up);
        per-message problems are logged with the message id.
        """
        if self._broken is not None:
            raise SqsRequestError(f"the SQS client is broken: {self._broken}")
        self._release(len(batch))
        deletes, failed, bounced, dispose = self._sort(batch)
        if bounced:
            for payload in bounced:
                self._uncount(payload.message_id)
            log.debug("showing %s again behind a held message", [p.message_id for p in bounced])
            await self._set_visibility(_handles(bounced), 0)
        if failed:
            await self._show_failed(failed)
        if dispose:
            await self._dispose(dispose)
        if deletes:
            await self._queue_deletes(deletes)

    def _sort(self, batch: Sequence[AdvanceItem]) -> tuple[
        list[SqsPayload], list[SqsPayload], list[SqsPayload], list[_Disposal]
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
        held, floors, fifo = self._held, self._floors, self._fifo
        deletes: list[SqsPayload] = []
        failed: list[SqsPayload] = []
        bounced: list[SqsPayload] = []
        dispose: list[_Disposal] = []
        for payload, outcome in batch:
            held.pop(payload.receipt_handle, None)  # renewal stops here
            message_id, lane = payload.message_id, payload.lane
            floor = floors.get(lane)
            if floor == message_id:
                del floors[lane]
            elif floor is not None and (fifo or outcome.failed):
                bounced.append(payload)
                continue
            if outcome.failed:
                if outcome.unseen == outcome.failed:
                    # Only subscribers that never had it in their filter failed (they
                    # died on another message): shown again, but not held against it.
                    self._uncount(message_id)
                failures = payload.message.receive_count - self._bounced.get(message_id, 0)
                if failures > self.settings.max_redeliveries:
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

    def _uncount(self, message_id: str) -> None:
        """Discount one receive of the message: that delivery did not fail on its account."""
        counts = self._bounced
        counts[message_id] = counts.get(message_id, 0) + 1
        while len(counts) > _MAX_HOLDS:  # a message another consumer took never resolves here
            del counts[next(iter(counts))]

    async def _show_failed(self, failed: list[SqsPayload]) -> None:
        base = self.settings.failure_visibility
        by_delay: dict[int, list[SqsPayload]] = {}
        for payload in failed:
            earlier = payload.message.receive_count - self._bounced.get(payload.message_id, 0) - 1
            delay = min(base * 2 ** max(earlier, 0), 43_200) if base else 0
            by_delay.setdefault(delay, []).append(payload)
        for delay, payloads in by_delay.items():
            log.info("re-showing %d failed message(s) of %s in %ds: %s", len(payloads),
                     queue_name(self._url), delay, [p.message_id for p in payloads])
            await self._set_visibility(_handles(payloads), delay)

    # -- visibility ----------------------------------------------------------------------

    async def _set_visibility(self, handles: Sequence[tuple[str, str]], seconds: int) -> list[str]:
        """Set the visibility of ``(receipt handle, message id)`` pairs, in batches of 10.

        Up to :data:`_CONCURRENT_BATCHES` calls are in flight at once.
        Returns the receipt handles that succeeded. Failures are logged: the
        message's current visibility then lapses on its own.
        """
        done: list[str] = []

        async def change(chunk: Sequence[tuple[str, str]]) -> None:
            entries = [{"Id": str(i), "ReceiptHandle": handle, "VisibilityTimeout": seconds}
                       for i, (handle, _) in enumerate(chunk)]
            try:
                response = await self._call("ChangeMessageVisibilityBatch",
                                            QueueUrl=self._url, Entries=entries)
            except SqsRequestError as exc:
                log.warning("changing visibility of %s failed (%s); it lapses on its own",
                            [message_id for _, message_id in chunk], exc)
                return
            refused = {f["Id"]: f.get("Code") for f in response.get("Failed") or []}
            for i, (handle, message_id) in enumerate(chunk):
                if str(i) in refused:
                    log.info("visibility of %s not changed: %s", message_id, refused[str(i)])
                else:
                    done.append(handle)

        async with self._visibility:
            chunks = _chunks(handles)
            for start in range(0, len(chunks), _CONCURRENT_BATCHES):
                await asyncio.gather(*(change(chunk) for chunk in
                                       chunks[start:start + _CONCURRENT_BATCHES]))
        return done

    async def _renew_loop(self) -> None:
        timeout = self.settings.visibility_timeout
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(max(0.2, timeout / 4))
            threshold = loop.time() + timeout / 2
            due = [handle for handle, held in self._held.items() if held.deadline < threshold]
            if not due:
                continue
            started = loop.time()
            renewed = await self._set_visibility(
                [(handle, self._held[handle].message_id) for handle in due], timeout)
            for handle in renewed:
                held = self._held.get(handle)
                if held is not None:  # not advanced meanwhile
                    held.deadline = started + timeout
            log.debug("renewed visibility of %d message(s)", len(renewed))

    # -- deletes -------------------------------------------------------------------------

    async def _queue_deletes(self, payloads: list[SqsPayload]) -> None:
        floors = self._floors
        for payload in payloads:  # resolved for good: forget its bounces and any hold
            self._bounced.pop(payload.message_id, None)
            if floors.get(payload.lane) == payload.message_id:
                del floors[payload.lane]
        self._deletes.extend(payloads)
        self._deletes_drained.clear()
        self._deletes_waiting.set()
        # Bounded: a message waiting here is no longer renewed, so when deletes back up
        # past two rounds of the senders, advance waits (and receiving pauses behind it).
        if len(self._deletes) > self._delete_backlog and self._broken is None:
            self._deletes_room.clear()
            await self._deletes_room.wait()

    async def _delete_loop(self) -> None:
        while True:
            while not self._deletes:
                if not self._deleting:
                    self._deletes_drained.set()
                self._deletes_waiting.clear()
                await self._deletes_waiting.wait()
            chunk = [self._deletes.popleft() for _ in range(min(BATCH, len(self._deletes)))]
            if len(self._deletes) <= self._delete_backlog:
                self._deletes_room.set()
            self._deleting += 1
            try:
                await self._delete(chunk)
            finally:
                self._deleting -= 1

    async def _delete(self, chunk: list[SqsPayload]) -> None:
        """Delete one chunk; retry what the service failed, log what it refused."""
        pending = list(chunk)
        for attempt in range(1, self.settings.retries + 1):
            entries = [{"Id": str(i), "ReceiptHandle": p.receipt_handle}
                       for i, p in enumerate(pending)]
            try:
                response = await self._call("DeleteMessageBatch", QueueUrl=self._url,
                                            Entries=entries)
            except SqsRequestError:
                if attempt == self.settings.retries:
                    raise  # the client is broken: the poll ends; undeleted messages come back
                await asyncio.sleep(0.1 * 2 ** attempt)
                continue
            retry: list[SqsPayload] = []
            for failure in response.get("Failed") or []:
                payload = pending[int(failure["Id"])]
                if failure.get("SenderFault") or attempt == self.settings.retries:
                    log.warning("delete of %s refused (%s: %s); it will be redelivered and "
                                "its events skipped as duplicates", payload.message_id,
                                failure.get("Code"), failure.get("Message"))
                else:
                    retry.append(payload)
            if not retry:
                return
            pending = retry
            await asyncio.sleep(0.1 * 2 ** attempt)

    # -- dead letters --------------------------------------------------------------------

    async def _dispose(self, items: list[_Disposal]) -> None:
        """Dead-letter ``items``, deleting each once its copy is stored somewhere.

        A copy goes to ``dead_letter_queue``, in batches that keep within
        SendMessageBatch's limits; when there is none, or SQS refuses the
        copy for good (a sender fault: too big, say), to the engine's
        ``dead_letter_fallback``; with neither, the message is discarded with
        a warning. A transient failure leaves the message where it is: it
        comes again.
        """
        if self._dlq_url is None:
            await self._dispose_elsewhere(items, "no dead_letter_queue configured")
            return
        pairs = [(item, self._dead_letter_entry(str(i), *item)) for i, item in enumerate(items)]
        for chunk in _sized_chunks(pairs):
            await self._send_dead_letters(chunk)

    async def _send_dead_letters(self, chunk: list[tuple[_Disposal, dict[str, Any]]]) -> None:
        """One SendMessageBatch; a batch SQS refuses as a whole is tried again entry by entry."""
        try:
            response = await self._call("SendMessageBatch", QueueUrl=self._dlq_url,
                                        Entries=[entry for _, entry in chunk])
        except SqsRequestError as exc:
            if exc.sender_fault and len(chunk) > 1:  # maybe one entry's fault: find it
                for pair in chunk:
                    await self._send_dead_letters([pair])
            elif exc.sender_fault:
                item = chunk[0][0]
                self._refusals[item[0].message_id] = exc.code or "refused"
                await self._dispose_elsewhere([item], "the dead_letter_queue refused it")
            else:
                log.error("dead-lettering %s failed (%s); they stay in %s and come again",  # noqa: TRY400 - the cause is in the message
                          [item[0].message_id for item, _ in chunk], exc,
                          queue_name(self._url))
            return
        failed = {f["Id"]: f for f in response.get("Failed") or []}
        stored, refused = [], []
        for item, entry in chunk:
            payload, reason, verdicts = item
            failure = failed.get(entry["Id"])
            if failure is None:
                self.dead_lettered += 1
                log.warning("dead-lettered %s from %s (%s%s)", payload.message_id,
                            queue_name(self._url), reason, _detail(verdicts, ": "))
                stored.append(payload)
            elif failure.get("SenderFault"):
                refused.append(item)
                self._refusals[payload.message_id] = str(failure.get("Code"))
            else:
                log.error("dead-lettering %s failed (%s); it stays and comes again",
                          payload.message_id, failure.get("Code"))
        await self._queue_deletes(stored)
        if refused:
            await self._dispose_elsewhere(refused, "the dead_letter_queue refused it")

    async def _dispose_elsewhere(self, items: list[_Disposal], why: str) -> None:
        """Keep ``items`` through the fallback (or discard them), then delete them."""
        keep = self.dead_letter_fallback
        kept = []
        for payload, reason, verdicts in items:
            message = payload.message
            refusal = self._refusals.pop(payload.message_id, None)
            cause = f"{why} ({refusal})" if refusal else why
            if keep is None:
                self.discarded += 1
                log.warning("discarding %s from %s (%s, received %d times%s): %s",
                            payload.message_id, queue_name(self._url), reason,
                            message.receive_count, _detail(verdicts, "; "), cause)
                kept.append(payload)
                continue
            try:
                await keep(DeadLetter(
                    stream=f"sqs {queue_name(self._url)}",
                    source=payload.message_id,
                    reason=f"{reason}; {cause}{_detail(verdicts, ': ')}",
                    triggers=verdict_triggers(verdicts),
                    payload=message.body.encode("utf-8", "surrogatepass"),
                    headers=tuple((name, _attribute_bytes(value)) for name, value in
                                  message.raw_attributes.items()),
                ))
            except Exception as exc:  # noqa: BLE001 - not kept: the message stays and comes again
                log.error("keeping %s in the dead-letter fallback failed (%s); it stays in %s "  # noqa: TRY400 - the cause is in the message
                          "and comes again", payload.message_id, exc, queue_name(self._url))
                continue
            self.dead_lettered += 1
            kept.append(payload)
        await self._queue_deletes(kept)

    def _dead_letter_entry(
        self, entry_id: str, payload: SqsPayload, reason: str, verdicts: Sequence[Verdict]
    ) -> dict[str, Any]:
        message = payload.message
        ours = {
            DLQ_ATTRIBUTE_QUEUE: {"DataType": "String", "StringValue": queue_name(self._url)},
            DLQ_ATTRIBUTE_MESSAGE_ID: {"DataType": "String", "StringValue": message.message_id},
            DLQ_ATTRIBUTE_REASON: {"DataType": "String", "StringValue": reason},
            DLQ_ATTRIBUTE_RECEIVE_COUNT: {"DataType": "Number",
                                          "StringValue": str(message.receive_count)},
        }
        if verdicts:
            triggers = ",".join(verdict_triggers(verdicts))
            ours[DLQ_ATTRIBUTE_TRIGGERS] = {"DataType": "String", "StringValue": triggers}
            ours[DLQ_ATTRIBUTE_DETAIL] = {"DataType": "String",
                                          "StringValue": _detail(verdicts, "")[:1024]}
        # Ours, even when the sender set them, never travel from the original.
        originals = [(k, v) for k, v in message.raw_attributes.items()
                     if k not in _OUR_ATTRIBUTES]
        room = _SQS_MAX_ATTRIBUTES - len(ours)
        if len(originals) > room:
            log.warning("dead-lettering %s: keeping %d of its %d attributes (SQS allows %d)",
                        message.message_id, room, len(originals), _SQS_MAX_ATTRIBUTES)
        attributes = {**dict(originals[:room]), **ours}
        entry: dict[str, Any] = {"Id": entry_id, "MessageBody": message.body,
                                 "MessageAttributes": attributes}
        if self._dlq_url is not None and self._dlq_url.endswith(".fifo"):
            entry["MessageGroupId"] = message.group_id or "sharedstream-dead-letters"
            entry["MessageDeduplicationId"] = f"{message.message_id}-{reason}"[:128]
        return entry

    # -- closing -------------------------------------------------------------------------

    async def aclose(self) -> None:
        """Flush queued deletes (10 s at most), stop the workers and the client, once."""
        if self._closed:
            return
        self._closed = True
        try:
            if (self._deletes or self._deleting) and self._broken is None:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(10):
                        await self._deletes_drained.wait()
        finally:
            for task in self._tasks:
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            self._tasks.clear()
            if self._deletes:
                log.warning("%d delete(s) not sent before closing; those messages come again "
                            "and their events are skipped as duplicates", len(self._deletes))
            if self._claimed and _consumed.get(self.settings.identity()) == (
                self.settings.fingerprint()
            ):
                del _consumed[self.settings.identity()]
            await self._exit.aclose()


_SNAKE = {
    "ReceiveMessage": "receive_message",
    "DeleteMessageBatch": "delete_message_batch",
    "ChangeMessageVisibilityBatch": "change_message_visibility_batch",
    "SendMessageBatch": "send_message_batch",
    "GetQueueUrl": "get_queue_url",
}
