"""The gRPC face of the Pub/Sub test server: ``google.pubsub.v1.Publisher`` and ``.Subscriber``.

Requests and responses are the raw protobuf classes of the client package
itself (``google.pubsub_v1.types.<Type>.pb()``), so the server speaks exactly
the client's wire format without compiling any ``.proto``. Each handler
turns a request into calls on :class:`~.state.PubSubState` and the result
into a response; a :class:`~.rules.Refused` becomes the gRPC status it names.
Methods not in :meth:`PubSubService.handlers` answer ``UNIMPLEMENTED``
(gRPC's default for a method with no handler).

Concurrency: every handler runs on the server's one event loop, so the
state needs no lock. A StreamingPull stream and a waiting Pull each sleep
on an :class:`asyncio.Event` registered for their subscription; the state's
``on_change`` hook sets them whenever something may have become deliverable
- a publish, an ack or nack (including the unary ``Acknowledge`` and
``ModifyAckDeadline`` calls the 2.x client sends instead of writing to the
stream), an expiry, the end of a backoff - so a stream never polls.
:meth:`PubSubService.sweep` is the one background task: it runs
:meth:`~.state.PubSubState.expire` when the next deadline or backoff is due.

**Exactly-once delivery.** On a subscription with it, an ``Acknowledge`` or
``ModifyAckDeadline`` naming ack ids that are no longer live (acked, nacked,
expired, never issued) fails as Pub/Sub fails it: ``INVALID_ARGUMENT`` with
a ``google.rpc.Status`` in the ``grpc-status-details-bin`` trailer holding
one ``google.rpc.ErrorInfo`` (reason ``EXACTLY_ONCE_ACKID_FAILURE``, domain
``pubsub.googleapis.com``) whose metadata maps each failed ack id to
``PERMANENT_FAILURE_INVALID_ACK_ID``. The live ack ids of the same request
are applied, and are absent from the map. google-api-core parses that
trailer into the raised error's ``details`` and ``metadata``. Without
exactly-once, stale ack ids are ignored and the call succeeds.

**Size limits**, as Pub/Sub's: a ``Publish`` request whose serialized
size is over 10 MB (10,000,000 bytes; the limit Google's own publisher
batches against) is ``INVALID_ARGUMENT`` naming ``request_size``, and one
over 10 MiB is refused earlier with the front end's ``Request payload size
exceeds the limit`` (one message over 10 MB is always in a request over
10 MB). A pull or StreamingPull response carries at most 10 MiB of
messages, but always at least one message. The server itself has no gRPC
size limit below that (:data:`~.server.SERVER_OPTIONS`).

**Message limits**, as Pub/Sub's (:func:`~.rules.check_messages`): a
``Publish`` of more than 1,000 messages, or with a message of more than 100
attributes, an attribute key over 256 bytes or starting with ``goog`` (but
the ``googclient_`` trace-context keys Google's clients write), an attribute
value over 1,024 bytes or an ordering key over 1,024 bytes, is
``INVALID_ARGUMENT`` and publishes nothing.

**Test hooks.** :meth:`PubSubService.break_streams` ends the open
StreamingPull streams with a gRPC status (a transient ``UNAVAILABLE``, say),
as Pub/Sub closes streams now and then; the state's
:meth:`~.state.PubSubState.lapse` ends leases early. Call both on the
server's event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
from google.pubsub_v1 import types

from sharedstream.testing.pubsub.rules import Refused, check_messages, check_name, project_of
from sharedstream.testing.pubsub.state import (
    DELETED_TOPIC,
    Consumer,
    Delivery,
    PubSubState,
    SubscriptionSettings,
)
from sharedstream.testing.pubsub.state_file import StateFile

__all__ = ["EXACTLY_ONCE_REASON", "INVALID_ACK_ID", "PAYLOAD_LIMIT", "REQUEST_LIMIT",
           "RESPONSE_BYTES", "AckIdsFailed", "PubSubService"]

BATCH = 500
"""Most messages in one StreamingPull response (smaller batches spread a
subscription's messages more evenly over its streams)."""

REQUEST_LIMIT = 10_000_000
"""Pub/Sub's limit on a serialized ``PublishRequest`` (10 MB, decimal): a larger one is
``INVALID_ARGUMENT`` (``request_size``). A message, its data, attributes and ordering key,
is limited to 10 MB too, so one message over that is a request over it."""

PAYLOAD_LIMIT = 10 * 1024 * 1024
"""Google's front end refuses a request body over 10 MiB before Pub/Sub reads it (with
another text); the server says what it says."""

RESPONSE_BYTES = 10 * 1024 * 1024
"""Most message bytes in one pull response, but for its first message (a response always
carries one message if one is ready, however large)."""

_Pb = Any
"""A raw protobuf message of the client package (proto-plus ships no types for it)."""


def _pb(proto_type: Any) -> Any:
    """The raw protobuf class behind a proto-plus type of ``google.pubsub_v1.types``."""
    return proto_type.pb()


_EMPTY: Any = importlib.import_module("google.protobuf.empty_pb2").Empty
_RPC_STATUS: Any = importlib.import_module("google.rpc.status_pb2").Status
_ERROR_INFO: Any = importlib.import_module("google.rpc.error_details_pb2").ErrorInfo

EXACTLY_ONCE_REASON = "EXACTLY_ONCE_ACKID_FAILURE"
"""The ``ErrorInfo.reason`` of an exactly-once ack or deadline change that failed."""
INVALID_ACK_ID = "PERMANENT_FAILURE_INVALID_ACK_ID"
"""What the ``ErrorInfo`` metadata says of an ack id that is no longer live."""
_DOMAIN = "pubsub.googleapis.com"
_DETAILS_TRAILER = "grpc-status-details-bin"


class AckIdsFailed(Refused):
    """An exactly-once subscription refuses some ack ids: ``failures`` maps each to why.

    The service answers it with ``INVALID_ARGUMENT`` and the failures as an
    ``ErrorInfo`` in the status details (see the module docstring).
    """

    def __init__(self, failures: dict[str, str]) -> None:
        super().__init__("INVALID_ARGUMENT", "Some acknowledgement ids in the request were "
                         "invalid. This could be because the acknowledgement ids have expired "
                         "or the acknowledgement ids were malformed.")
        self.failures = failures

    def trailer(self) -> tuple[tuple[str, bytes]]:
        """The ``grpc-status-details-bin`` trailing metadata that carries the failures.

        Its ``google.rpc.Status`` repeats the call's code and message: the
        client checks that they agree before reading the details.
        """
        info = _ERROR_INFO(reason=EXACTLY_ONCE_REASON, domain=_DOMAIN, metadata=self.failures)
        status = _RPC_STATUS(code=grpc.StatusCode.INVALID_ARGUMENT.value[0], message=str(self))
        status.details.add().Pack(info)
        return ((_DETAILS_TRAILER, status.SerializeToString()),)


def _seconds(duration: _Pb) -> float:
    return float(duration.seconds + duration.nanos / 1e9)


def _settings(request: _Pb) -> SubscriptionSettings:
    """Validate a CreateSubscription request the way Pub/Sub does; refuse what we lack."""
    for unsupported, present in (("filter", bool(request.filter)),
                                 ("push_config", bool(request.push_config.push_endpoint)),
                                 ("bigquery_config", bool(request.bigquery_config.table)),
                                 ("cloud_storage_config",
                                  bool(request.cloud_storage_config.bucket))):
        if present:
            raise Refused("UNIMPLEMENTED", f"the test server has no {unsupported}")
    deadline = request.ack_deadline_seconds or 10
    if not 10 <= deadline <= 600:
        raise Refused("INVALID_ARGUMENT", f"ack_deadline_seconds {deadline} is outside 10..600")
    attempts, dead_letter_topic = 0, ""
    if request.HasField("dead_letter_policy"):
        attempts = request.dead_letter_policy.max_delivery_attempts or 5
        dead_letter_topic = request.dead_letter_policy.dead_letter_topic
        if not 5 <= attempts <= 100:
            raise Refused("INVALID_ARGUMENT", f"max_delivery_attempts {attempts} is outside 5..100")
        check_name(dead_letter_topic, "topics", "dead_letter_topic")
    minimum = maximum = 0.0
    if request.HasField("retry_policy"):
        policy = request.retry_policy
        minimum = _seconds(policy.minimum_backoff) if policy.HasField("minimum_backoff") else 10
        maximum = _seconds(policy.maximum_backoff) if policy.HasField("maximum_backoff") else 600
        if not 0 <= minimum <= maximum <= 600:
            raise Refused("INVALID_ARGUMENT", "retry_policy needs 0 <= minimum_backoff <= "
                          "maximum_backoff <= 600 s")
        maximum = max(maximum, 1e-9)  # a policy of zeros is still a policy (no delay)
    return SubscriptionSettings(
        topic=request.topic, ack_deadline=deadline, max_delivery_attempts=attempts,
        dead_letter_topic=dead_letter_topic, minimum_backoff=minimum, maximum_backoff=maximum,
        ordering=request.enable_message_ordering,
        exactly_once=request.enable_exactly_once_delivery)


def _page(items: Sequence[Any], size: int, token: str) -> tuple[Sequence[Any], str]:
    """One page of ``items`` and the token of the next (``""`` at the end); 0 = all."""
    try:
        start = int(token or 0)
    except ValueError:
        raise Refused("INVALID_ARGUMENT", f"invalid page_token {token!r}") from None
    end = len(items) if size <= 0 else start + size
    return items[start:end], (str(end) if end < len(items) else "")


@dataclass(eq=False)
class _Stream:
    """One StreamingPull call: its subscription, flow control and what wakes it."""

    subscription: str
    consumer: Consumer
    deadline: float
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    confirmed: list[tuple[str, list[str], list[str]]] = field(default_factory=list)
    """Exactly-once confirmations to send: (kind, ack ids, stale ack ids)."""
    ended: bool = False
    broken: Refused | None = None
    """Set by :meth:`PubSubService.break_streams`: the status the stream ends with."""


class PubSubService:
    """The Publisher and Subscriber services over one :class:`~.state.PubSubState`.

    Create it inside the event loop that will serve it; hand
    :meth:`handlers` to a ``grpc.aio`` server and run :meth:`sweep` in a
    task for as long as the server runs. ``pull_wait`` bounds how long a
    unary Pull with nothing to deliver waits before answering empty.
    ``state_file`` (optional) is loaded now if it exists and written after
    every change (see :mod:`.state_file`); without it, everything is in
    memory only.
    """

    def __init__(self, *, pull_wait: float = 5.0, state_file: Path | None = None) -> None:
        self.state = PubSubState(on_change=self._changed)
        self.pull_wait = pull_wait
        self._state_file = None if state_file is None else StateFile(state_file)
        if self._state_file is not None:
            self._state_file.load(self.state)
        self._waiters: dict[str, set[asyncio.Event]] = {}
        self._streams: set[_Stream] = set()  # the open StreamingPull calls
        self._rescheduled = asyncio.Event()

    def _save(self) -> None:
        """Write the state file, if there is one (after anything that may have changed)."""
        if self._state_file is not None:
            self._state_file.save(self.state)

    def _changed(self, subscription: str) -> None:
        for event in self._waiters.get(subscription, ()):
            event.set()

    @contextlib.contextmanager
    def _waiting(self, subscription: str, event: asyncio.Event) -> Any:
        self._waiters.setdefault(subscription, set()).add(event)
        try:
            yield
        finally:
            waiters = self._waiters.get(subscription, set())
            waiters.discard(event)
            if not waiters:
                self._waiters.pop(subscription, None)

    async def sweep(self) -> None:
        """Expire deadlines and end backoffs when due, forever (cancel it to stop)."""
        while True:
            self._rescheduled.clear()
            self.state.expire()
            self._save()
            due = self.state.next_due()
            delay = 1.0 if due is None else min(1.0, max(0.0, due - self.state.clock()))
            with contextlib.suppress(TimeoutError):  # the due time came: expire again
                await asyncio.wait_for(self._rescheduled.wait(), delay)

    def break_streams(self, subscription: str | None = None, *, status: str = "UNAVAILABLE",
                      message: str = "the test server broke the stream") -> int:
        """A test hook: end every open StreamingPull (of ``subscription``, or all) with ``status``.

        ``status`` is a gRPC status code's name; the streams end with it as
        soon as their handlers run next (at once: they are woken). Their
        leases live on, as Pub/Sub's do when a stream breaks: acks and
        deadline changes by unary call still take, and what is not acked
        is redelivered when its deadline passes. Streams opened afterwards
        are not affected. Returns how many streams it broke. Call it on the
        server's event loop.
        """
        grpc.StatusCode[status]  # an unknown name fails here, in the caller's test
        broken = 0
        for stream in self._streams:
            if subscription in (None, stream.subscription) and stream.broken is None:
                stream.broken = Refused(status, message)
                stream.wake.set()
                broken += 1
        return broken

    def handlers(self) -> list[grpc.GenericRpcHandler]:
        """The generic handlers of both services, for ``grpc.aio.server(handlers=...)``."""
        publisher = {
            "CreateTopic": self._unary(self._create_topic, types.Topic, types.Topic),
            "GetTopic": self._unary(self._get_topic, types.GetTopicRequest, types.Topic),
            "ListTopics": self._unary(self._list_topics, types.ListTopicsRequest,
                                      types.ListTopicsResponse),
            "ListTopicSubscriptions": self._unary(
                self._list_topic_subscriptions, types.ListTopicSubscriptionsRequest,
                types.ListTopicSubscriptionsResponse),
            "DeleteTopic": self._unary(self._delete_topic, types.DeleteTopicRequest, None),
            "Publish": self._unary(self._publish, types.PublishRequest, types.PublishResponse),
        }
        subscriber = {
            "CreateSubscription": self._unary(self._create_subscription, types.Subscription,
                                              types.Subscription),
            "GetSubscription": self._unary(self._get_subscription, types.GetSubscriptionRequest,
                                           types.Subscription),
            "ListSubscriptions": self._unary(self._list_subscriptions,
                                             types.ListSubscriptionsRequest,
                                             types.ListSubscriptionsResponse),
            "DeleteSubscription": self._unary(self._delete_subscription,
                                              types.DeleteSubscriptionRequest, None),
            "Acknowledge": self._unary(self._acknowledge, types.AcknowledgeRequest, None),
            "ModifyAckDeadline": self._unary(self._modify_ack_deadline,
                                             types.ModifyAckDeadlineRequest, None),
            "Pull": self._unary(self._pull, types.PullRequest, types.PullResponse),
            "StreamingPull": grpc.stream_stream_rpc_method_handler(
                self._streaming_pull,
                request_deserializer=_pb(types.StreamingPullRequest).FromString,
                response_serializer=_serialize),
        }
        return [grpc.method_handlers_generic_handler("google.pubsub.v1.Publisher", publisher),
                grpc.method_handlers_generic_handler("google.pubsub.v1.Subscriber", subscriber)]

    def _unary(self, behaviour: Callable[[_Pb, grpc.aio.ServicerContext[Any, Any]],
                                         Awaitable[_Pb]],
               request_type: Any, response_type: Any) -> grpc.RpcMethodHandler[Any, Any]:
        del response_type  # named for the reader; the serializer takes any message

        async def call(request: _Pb, context: grpc.aio.ServicerContext[Any, Any]) -> _Pb:
            try:
                return await behaviour(request, context)
            except AckIdsFailed as exc:
                await context.abort(grpc.StatusCode[exc.status], str(exc),
                                    trailing_metadata=exc.trailer())
            except Refused as exc:
                await context.abort(grpc.StatusCode[exc.status], str(exc))
            finally:
                self._save()  # before the answer: what a caller was told survives a kill

        return grpc.unary_unary_rpc_method_handler(
            call, request_deserializer=_pb(request_type).FromString,
            response_serializer=_serialize)

    # -- Publisher ----------------------------------------------------------

    async def _create_topic(self, request: _Pb, context: object) -> _Pb:
        if request.HasField("schema_settings"):
            raise Refused("UNIMPLEMENTED", "the test server has no schemas")
        spec = _pb(types.Topic)()
        spec.CopyFrom(request)
        self.state.create_topic(request.name, spec)
        return spec

    async def _get_topic(self, request: _Pb, context: object) -> _Pb:
        return self.state.topic(request.topic)

    async def _list_topics(self, request: _Pb, context: object) -> _Pb:
        names = sorted(n for n in self.state.topics if project_of(n) == request.project)
        page, token = _page(names, request.page_size, request.page_token)
        response = _pb(types.ListTopicsResponse)(next_page_token=token)
        response.topics.extend(self.state.topics[name] for name in page)
        return response

    async def _list_topic_subscriptions(self, request: _Pb, context: object) -> _Pb:
        names = self.state.topic_subscriptions(request.topic)
        page, token = _page(names, request.page_size, request.page_token)
        return _pb(types.ListTopicSubscriptionsResponse)(subscriptions=page,
                                                         next_page_token=token)

    async def _delete_topic(self, request: _Pb, context: object) -> _Pb:
        self.state.delete_topic(request.topic)
        return _EMPTY()

    async def _publish(self, request: _Pb, context: object) -> _Pb:
        messages = [(message.data, message.attributes, message.ordering_key)
                    for message in request.messages]
        check_messages(messages)
        size = request.ByteSize()
        if size > PAYLOAD_LIMIT:
            raise Refused("INVALID_ARGUMENT", "Request payload size exceeds the limit: "
                          f"{PAYLOAD_LIMIT} bytes.")
        if size > REQUEST_LIMIT:
            raise Refused("INVALID_ARGUMENT", f"The value for request_size is too large. You "
                          f"passed {size} in the request, but the maximum value is "
                          f"{REQUEST_LIMIT}.")
        ids = self.state.publish(request.topic, messages)
        return _pb(types.PublishResponse)(message_ids=ids)

    # -- Subscriber: administration -----------------------------------------

    async def _create_subscription(self, request: _Pb, context: object) -> _Pb:
        check_name(request.name, "subscriptions")
        settings = _settings(request)
        spec = _pb(types.Subscription)()
        spec.CopyFrom(request)
        spec.ack_deadline_seconds = int(settings.ack_deadline)
        if settings.max_delivery_attempts:
            spec.dead_letter_policy.max_delivery_attempts = settings.max_delivery_attempts
        self.state.create_subscription(request.name, settings, spec)
        return spec

    def _described(self, name: str) -> _Pb:
        _, topic, spec = self.state.subscription(name)
        if topic != DELETED_TOPIC:
            return spec
        described = _pb(types.Subscription)()
        described.CopyFrom(spec)
        described.topic = topic
        return described

    async def _get_subscription(self, request: _Pb, context: object) -> _Pb:
        return self._described(request.subscription)

    async def _list_subscriptions(self, request: _Pb, context: object) -> _Pb:
        names = [n for n in self.state.subscriptions() if project_of(n) == request.project]
        page, token = _page(names, request.page_size, request.page_token)
        response = _pb(types.ListSubscriptionsResponse)(next_page_token=token)
        response.subscriptions.extend(self._described(name) for name in page)
        return response

    async def _delete_subscription(self, request: _Pb, context: object) -> _Pb:
        self.state.delete_subscription(request.subscription)
        return _EMPTY()

    # -- Subscriber: delivery -----------------------------------------------

    async def _acknowledge(self, request: _Pb, context: object) -> _Pb:
        stale = self.state.acknowledge(request.subscription, request.ack_ids)
        self._refuse_stale(request.subscription, stale)
        return _EMPTY()

    async def _modify_ack_deadline(self, request: _Pb, context: object) -> _Pb:
        stale = self.state.modify_deadline(request.subscription, request.ack_ids,
                                           request.ack_deadline_seconds)
        self._rescheduled.set()
        self._refuse_stale(request.subscription, stale)
        return _EMPTY()

    def _refuse_stale(self, subscription: str, stale: Sequence[str]) -> None:
        """Raise :class:`AckIdsFailed` for ``stale`` ack ids on an exactly-once subscription.

        Called after the live ack ids of the request were applied; without
        exactly-once, stale ack ids are silently ignored (best effort).
        """
        settings, _, _ = self.state.subscription(subscription)
        if stale and settings.exactly_once:
            raise AckIdsFailed(dict.fromkeys(stale, INVALID_ACK_ID))

    async def _pull(self, request: _Pb, context: grpc.aio.ServicerContext[Any, Any]) -> _Pb:
        if request.max_messages <= 0:
            raise Refused("INVALID_ARGUMENT", "max_messages must be positive")
        settings, _, _ = self.state.subscription(request.subscription)
        loop = asyncio.get_running_loop()
        remaining = context.time_remaining()
        wait = self.pull_wait if remaining is None else min(self.pull_wait, remaining - 0.2)
        give_up = loop.time() + (0 if request.return_immediately else wait)
        wake = asyncio.Event()
        with self._waiting(request.subscription, wake):
            while True:
                wake.clear()
                taken = self.state.take(request.subscription, None, request.max_messages,
                                        settings.ack_deadline, RESPONSE_BYTES)
                if taken or loop.time() >= give_up:
                    break
                with contextlib.suppress(TimeoutError):  # nothing came: answer empty
                    await asyncio.wait_for(wake.wait(), give_up - loop.time())
        self._rescheduled.set()
        response = _pb(types.PullResponse)()
        _fill(response.received_messages, taken, reveal_attempt=bool(
            settings.max_delivery_attempts))
        return response

    async def _streaming_pull(self, requests: AsyncIterator[_Pb],
                              context: grpc.aio.ServicerContext[Any, Any]) -> None:
        """One stream: deliver within its flow control until the client closes it."""
        requests = aiter(requests)  # read on from the same iterator after the first
        first = await anext(requests, None)
        if first is None:
            return
        try:
            stream = self._open(first)
            self._streams.add(stream)
            with self._waiting(stream.subscription, stream.wake):
                try:
                    async with asyncio.TaskGroup() as tasks:
                        reader = tasks.create_task(self._read(requests, stream),
                                                   name=f"pubsub-stream-read-{first.client_id}")
                        try:
                            await self._deliver(stream, context)
                        finally:
                            reader.cancel()  # the client is gone or closed the stream
                finally:
                    self._streams.discard(stream)
                    self.state.close_consumer(stream.subscription, stream.consumer)
        except* Refused as refused:  # a bad request, or the subscription was deleted
            cause: BaseException = refused
            while isinstance(cause, BaseExceptionGroup):
                cause = cause.exceptions[0]
            status = cause.status if isinstance(cause, Refused) else "INTERNAL"
            await context.abort(grpc.StatusCode[status], str(cause))

    def _open(self, first: _Pb) -> _Stream:
        if not first.subscription:
            raise Refused("INVALID_ARGUMENT", "the first request must name a subscription")
        self.state.subscription(first.subscription)
        stream = _Stream(first.subscription, Consumer(max(first.max_outstanding_messages, 0),
                                                      max(first.max_outstanding_bytes, 0)),
                         deadline=self._stream_deadline(first.stream_ack_deadline_seconds))
        self._apply(first, stream)
        return stream

    @staticmethod
    def _stream_deadline(seconds: int) -> float:
        if not 10 <= seconds <= 600:
            raise Refused("INVALID_ARGUMENT",
                          f"stream_ack_deadline_seconds {seconds} is outside 10..600")
        return float(seconds)

    async def _read(self, requests: AsyncIterator[_Pb], stream: _Stream) -> None:
        """Apply what the client writes on the stream (acks, deadlines); mark the end."""
        async for request in requests:
            if request.stream_ack_deadline_seconds:
                stream.deadline = self._stream_deadline(request.stream_ack_deadline_seconds)
            self._apply(request, stream)
            self._save()
        stream.ended = True
        stream.wake.set()

    def _apply(self, request: _Pb, stream: _Stream) -> None:
        ids, seconds = request.modify_deadline_ack_ids, request.modify_deadline_seconds
        if len(ids) != len(seconds):
            raise Refused("INVALID_ARGUMENT", "modify_deadline_ack_ids and "
                          "modify_deadline_seconds differ in length")
        settings, _, _ = self.state.subscription(stream.subscription)
        if request.ack_ids:
            stale = self.state.acknowledge(stream.subscription, request.ack_ids)
            if settings.exactly_once:
                stream.confirmed.append(("ack", list(request.ack_ids), stale))
        for ack_id, deadline in zip(ids, seconds, strict=True):
            stale = self.state.modify_deadline(stream.subscription, [ack_id], deadline)
            if settings.exactly_once:
                stream.confirmed.append(("modack", [ack_id], stale))
        if ids:
            self._rescheduled.set()
        if stream.confirmed:
            stream.wake.set()

    async def _deliver(self, stream: _Stream,
                       context: grpc.aio.ServicerContext[Any, Any]) -> None:
        while True:
            stream.wake.clear()
            if stream.broken is not None:
                raise stream.broken
            if stream.ended:
                return
            settings, _, _ = self.state.subscription(stream.subscription)
            taken = self.state.take(stream.subscription, stream.consumer, BATCH,
                                    stream.deadline, RESPONSE_BYTES)
            if not taken and not stream.confirmed:
                await stream.wake.wait()
                continue
            response = _pb(types.StreamingPullResponse)()
            properties = response.subscription_properties
            properties.exactly_once_delivery_enabled = settings.exactly_once
            properties.message_ordering_enabled = settings.ordering
            _fill(response.received_messages, taken,
                  reveal_attempt=bool(settings.max_delivery_attempts))
            _confirm(response, stream.confirmed)
            stream.confirmed.clear()
            if taken:
                self._rescheduled.set()
            try:
                await context.write(response)
            except Exception:
                if context.done():
                    # The client went away during the write (a cancelled stream, a process
                    # stopping): nobody to tell. What the stream leased comes again once
                    # its deadline passes, as after any stream that ends.
                    return
                raise


def _serialize(message: _Pb) -> bytes:
    data: bytes = message.SerializeToString()
    return data


def _fill(received: _Pb, taken: Sequence[Delivery], *, reveal_attempt: bool) -> None:
    """Add ``taken`` to a repeated ReceivedMessage field.

    ``delivery_attempt`` is set only with a dead-letter policy, as Pub/Sub does.
    """
    for delivery in taken:
        message = delivery.message
        item = received.add(ack_id=delivery.ack_id,
                            delivery_attempt=delivery.attempt if reveal_attempt else 0)
        wire = item.message
        wire.data = message.data
        wire.message_id = message.message_id
        wire.ordering_key = message.ordering_key
        wire.attributes.update(message.attributes)
        seconds = int(message.publish_time)
        wire.publish_time.seconds = seconds
        wire.publish_time.nanos = int((message.publish_time - seconds) * 1e9)


def _confirm(response: _Pb, confirmed: Sequence[tuple[str, list[str], list[str]]]) -> None:
    """Exactly-once confirmations: every live ack id succeeded; stale ones are invalid."""
    for kind, ack_ids, stale in confirmed:
        target = (response.acknowledge_confirmation if kind == "ack"
                  else response.modify_ack_deadline_confirmation)
        target.ack_ids.extend(a for a in ack_ids if a not in stale)
        target.invalid_ack_ids.extend(stale)
