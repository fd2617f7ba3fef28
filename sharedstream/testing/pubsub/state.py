"""What the Pub/Sub test server knows: topics, subscriptions and leases - synchronous, no I/O.

This module imports neither gRPC nor the Google client: the service
(:mod:`.service`) turns requests into calls here and the results into
protobuf. Everything runs on the server's one event-loop thread; nothing
here is thread-safe.

Terms:

* a *message* is published once to a topic and never changes;
* an *entry* is a message's place in one subscription: how many times it
  was delivered, its current lease, when it may be delivered again;
* a *lease* is one delivery of an entry: an ack id, a deadline, and the
  consumer it went to;
* a *consumer* is one StreamingPull stream with its flow-control limits (a
  unary Pull has none).

Invariants:

1. An entry is in exactly one place: *ready* (deliverable now), *delayed*
   (backing off after a nack or an expiry), *leased* (one live lease), or
   *held* behind an earlier entry of its ordering key. An entry that is
   acked or dead-lettered is gone from all of them (but see 3 for an acked
   entry of an ordering key, which may come again).
2. An ack id names one delivery. Once its lease ends (ack, nack, expiry, or
   revoked by 3) the id is stale: acks and deadline changes naming it are
   ignored, and a redelivery carries a new id.
3. With message ordering on, an ordering key is a cursor over its entries
   in publish order (:class:`_Key`): the entries before ``sent`` are out
   (leased, or acked while an earlier one is not), the entry at ``sent`` is
   scheduled (ready or delayed), the rest are held. Several entries of a
   key are out at once, always a prefix, so they are delivered in order.
   The cursor moves past the first entries once they are acked (or
   dead-lettered). A nack or an expiry of an out entry rewinds the key to
   it: the leases of the entries after it are revoked and those entries,
   acked ones too, are delivered again after it, as Pub/Sub replays a key
   from its first unacknowledged message. (On an exactly-once
   subscription an ack is final: an acked entry leaves its key at once and
   never comes again.) Entries of other keys, and entries without a key,
   are not held back.
4. A key with live leases on a stream belongs to that stream: no other
   stream is handed its entries until those leases end (Pub/Sub sends a
   key's messages to one subscriber client at a time). A unary Pull takes
   only keys no stream holds.
5. A consumer's outstanding count and bytes are the sums over its live
   leases; :meth:`PubSubState.take` never goes past its limits, except to
   hand out one message larger than the byte limit when nothing else is
   outstanding (as Pub/Sub does).
6. Whatever can make an entry deliverable, or free room in a consumer,
   calls ``on_change`` with the subscription's name before returning.

Reading it: :meth:`PubSubState.counts` is the one public, read-only view
of a subscription's backlog (what a test or the demo asks "how many are not
acked yet?"); nothing outside this module reads the per-subscription queues.
:meth:`PubSubState.lapse` is a test hook that ends leases early, as if their
deadline had passed.

Time is two injected clocks: ``clock`` (monotonic seconds) for deadlines
and backoffs, ``wall`` (epoch seconds) for publish times. Deadlines are
checked by :meth:`PubSubState.expire`, which the service calls when
:meth:`PubSubState.next_due` says something is due.
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from sharedstream.testing.pubsub.rules import Refused, check_name

__all__ = [
    "DELETED_TOPIC",
    "Consumer",
    "Delivery",
    "Message",
    "PubSubState",
    "Snapshot",
    "SubscriptionCounts",
    "SubscriptionSettings",
    "SubscriptionSnapshot",
]

DELETED_TOPIC = "_deleted-topic_"
"""What a subscription names as its topic once the topic is deleted (as Pub/Sub does)."""

@dataclass(frozen=True, slots=True)
class Message:
    """One published message, as every subscription of its topic delivers it."""

    message_id: str
    data: bytes
    attributes: Mapping[str, str]
    ordering_key: str
    publish_time: float
    """Epoch seconds (the ``wall`` clock) when it was published."""
    size: int = field(init=False)
    """What flow control counts: data, attribute keys and values, ordering key."""

    def __post_init__(self) -> None:
        size = len(self.data) + len(self.ordering_key.encode()) + sum(
            len(k.encode()) + len(v.encode()) for k, v in self.attributes.items())
        object.__setattr__(self, "size", size)


@dataclass(frozen=True, slots=True)
class SubscriptionSettings:
    """What the server does for one subscription (validated by the service)."""

    topic: str
    ack_deadline: float = 10.0
    """Seconds a unary Pull's delivery stays leased."""
    max_delivery_attempts: int = 0
    """With a dead-letter policy, deliveries before forwarding; 0 without one."""
    dead_letter_topic: str = ""
    minimum_backoff: float = 0.0
    """Retry policy: the delay before redelivering after the first failed delivery."""
    maximum_backoff: float = 0.0
    """Retry policy: the backoff doubles per failed delivery up to this; 0 = no policy."""
    ordering: bool = False
    exactly_once: bool = False


@dataclass(eq=False, slots=True)
class Consumer:
    """One StreamingPull stream's flow control: limits (0 = none) and what is outstanding."""

    max_messages: int = 0
    max_bytes: int = 0
    messages: int = 0
    bytes: int = 0

    def has_room_for(self, size: int) -> bool:
        """Whether one more message of ``size`` bytes may be handed to this consumer."""
        if self.max_messages and self.messages >= self.max_messages:
            return False
        return not (self.max_bytes and self.messages and self.bytes + size > self.max_bytes)


@dataclass(eq=False, slots=True)
class _Entry:
    message: Message
    seq: int
    attempts: int = 0
    lease: Delivery | None = None
    """Its live lease, if it is out and not acked."""
    acked: bool = False
    """Acked while an earlier entry of its ordering key is not: it comes again on a rewind."""


@dataclass(eq=False, slots=True)
class _Key:
    """One ordering key's cursor (invariant 3) and the stream that holds it (invariant 4)."""

    entries: deque[_Entry] = field(default_factory=deque)
    """From the first entry not yet acked, in publish order."""
    sent: int = 0
    """How many entries, from the front, are out; ``entries[sent]`` is scheduled."""
    owner: Consumer | None = None
    """The stream its live leases went to (``None``: none, or only unary Pulls)."""
    leased: int = 0
    """How many of its entries have a live lease."""


@dataclass(eq=False, slots=True)
class Delivery:
    """One lease: the entry delivered, its ack id, deadline and consumer."""

    ack_id: str
    entry: _Entry
    deadline: float
    consumer: Consumer | None

    @property
    def message(self) -> Message:
        """The message delivered."""
        return self.entry.message

    @property
    def attempt(self) -> int:
        """Which delivery of the message this is, from 1."""
        return self.entry.attempts


class _Subscription:
    """One subscription's entries (see the module's invariants)."""

    def __init__(self, name: str, settings: SubscriptionSettings, spec: object) -> None:
        self.name, self.settings, self.spec = name, settings, spec
        self.topic = settings.topic
        self.ready: deque[_Entry] = deque()
        self.delayed: list[tuple[float, int, _Entry]] = []  # heap by available time
        self.keys: dict[str, _Key] = {}  # ordering key -> its cursor (invariant 3)
        self.leases: dict[str, Delivery] = {}
        self.deadlines: list[tuple[float, str]] = []  # heap; stale items skipped on pop

    def key_of(self, entry: _Entry) -> _Key | None:
        """The cursor of ``entry``'s ordering key, or ``None`` when no key orders it."""
        if not self.settings.ordering or not entry.message.ordering_key:
            return None
        return self.keys[entry.message.ordering_key]


@dataclass(frozen=True, slots=True)
class SubscriptionCounts:
    """Where a subscription's unsettled messages are (invariant 1): a read-only record.

    Each message not acked nor dead-lettered is counted once, in the one
    place it is.
    """

    ready: int
    """Deliverable now."""
    delayed: int
    """Backing off after a nack or an expiry (retry policy)."""
    held: int
    """Waiting behind an earlier message of their ordering key."""
    leased: int
    """Delivered, with a live lease (not acked, not yet expired)."""

    @property
    def unacked(self) -> int:
        """Every message not acked nor dead-lettered: the sum of the four."""
        return self.ready + self.delayed + self.held + self.leased


@dataclass(frozen=True, slots=True)
class SubscriptionSnapshot:
    """One subscription as a restart keeps it: its unsettled messages, leases forgotten."""

    name: str
    settings: SubscriptionSettings
    topic: str
    """Its topic now (:data:`DELETED_TOPIC` once that is deleted)."""
    spec: object
    entries: tuple[tuple[Message, int], ...]
    """Every message not acked nor dead-lettered, with its deliveries so far, oldest first."""


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What :meth:`PubSubState.snapshot` returns and :meth:`PubSubState.restore` loads."""

    next_id: int
    """The next message id (and entry sequence): ids stay unique across restarts."""
    topics: Mapping[str, object]
    subscriptions: tuple[SubscriptionSnapshot, ...]


class PubSubState:
    """All topics and subscriptions of one server (see the module's invariants)."""

    def __init__(
        self, *, clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        on_change: Callable[[str], None] = lambda name: None,
    ) -> None:
        self.clock, self.wall, self.on_change = clock, wall, on_change
        self.topics: dict[str, object] = {}  # name -> the spec Get/List echo
        self._attached: dict[str, set[str]] = {}  # topic -> its subscriptions
        self._subscriptions: dict[str, _Subscription] = {}
        self._ids = itertools.count(1)

    # -- topics -------------------------------------------------------------

    def create_topic(self, name: str, spec: object) -> None:
        """Add a topic; ``ALREADY_EXISTS`` if there is one of that name."""
        if check_name(name, "topics") in self.topics:
            raise Refused("ALREADY_EXISTS", f"topic {name} already exists")
        self.topics[name] = spec
        self._attached[name] = set()

    def topic(self, name: str) -> object:
        """The spec of topic ``name``; ``NOT_FOUND`` if none, ``INVALID_ARGUMENT`` if malformed."""
        try:
            return self.topics[name]
        except KeyError:
            check_name(name, "topics")
            raise Refused("NOT_FOUND", "Resource not found (resource="
                          f"{name.rsplit('/', 1)[-1]}).") from None

    def delete_topic(self, name: str) -> None:
        """Remove a topic; its subscriptions stay, naming :data:`DELETED_TOPIC`."""
        self.topic(name)
        del self.topics[name]
        for subscription in self._attached.pop(name):
            self._subscriptions[subscription].topic = DELETED_TOPIC

    def topic_subscriptions(self, name: str) -> list[str]:
        """The names of the subscriptions attached to topic ``name``, sorted."""
        self.topic(name)
        return sorted(self._attached[name])

    # -- subscriptions ------------------------------------------------------

    def create_subscription(self, name: str, settings: SubscriptionSettings,
                            spec: object) -> None:
        """Attach a subscription to its topic; it receives what is published from now on."""
        if check_name(name, "subscriptions") in self._subscriptions:
            raise Refused("ALREADY_EXISTS", f"subscription {name} already exists")
        self.topic(settings.topic)
        if settings.dead_letter_topic:
            self.topic(settings.dead_letter_topic)
        self._subscriptions[name] = _Subscription(name, settings, spec)
        self._attached[settings.topic].add(name)

    def subscription(self, name: str) -> tuple[SubscriptionSettings, str, object]:
        """Settings, current topic name and spec of a subscription; ``NOT_FOUND`` if none."""
        sub = self._get(name)
        return sub.settings, sub.topic, sub.spec

    def subscriptions(self) -> list[str]:
        """Every subscription's name, sorted."""
        return sorted(self._subscriptions)

    def counts(self, name: str) -> SubscriptionCounts:
        """How many of subscription ``name``'s messages are where; ``NOT_FOUND`` if none.

        Read-only: it changes nothing and calls nothing. Counts are as of
        the last :meth:`expire` (a lease past its deadline that no sweep has
        ended yet is still ``leased``). Costs one pass over the
        subscription's ordering-key queues.
        """
        sub = self._get(name)
        # Past a key's scheduled entry, the rest are held (invariant 3); an acked entry
        # before it is not counted (it comes again only if the key is rewound).
        held = sum(max(0, len(key.entries) - key.sent - 1) for key in sub.keys.values())
        return SubscriptionCounts(ready=len(sub.ready), delayed=len(sub.delayed), held=held,
                                  leased=len(sub.leases))

    def delete_subscription(self, name: str) -> None:
        """Remove a subscription with its entries; its streams are woken to find it gone."""
        sub = self._get(name)
        del self._subscriptions[name]
        self._attached.get(sub.topic, set()).discard(name)
        for lease in sub.leases.values():
            self._release(lease)
        self.on_change(name)

    def _get(self, name: str) -> _Subscription:
        """Subscription ``name``; ``NOT_FOUND`` if none, ``INVALID_ARGUMENT`` if malformed."""
        try:
            return self._subscriptions[name]
        except KeyError:
            check_name(name, "subscriptions")
            raise Refused("NOT_FOUND", "Resource not found (resource="
                          f"{name.rsplit('/', 1)[-1]}).") from None

    # -- publish ------------------------------------------------------------

    def publish(self, topic: str,
                messages: Sequence[tuple[bytes, Mapping[str, str], str]]) -> list[str]:
        """Store ``(data, attributes, ordering key)`` messages; return their ids, in order."""
        self.topic(topic)
        now = self.wall()
        published = [Message(str(next(self._ids)), data, dict(attributes), key, now)
                     for data, attributes, key in messages]
        for name in self._attached[topic]:
            sub = self._subscriptions[name]
            for message in published:
                self._enqueue(sub, message)
            self.on_change(name)
        return [message.message_id for message in published]

    def _enqueue(self, sub: _Subscription, message: Message) -> None:
        self._place(sub, _Entry(message, next(self._ids)))

    def _place(self, sub: _Subscription, entry: _Entry) -> None:
        if sub.settings.ordering and entry.message.ordering_key:
            key = sub.keys.setdefault(entry.message.ordering_key, _Key())
            key.entries.append(entry)
            if len(key.entries) - 1 > key.sent:
                return  # held behind an earlier entry of its key (invariant 3)
        sub.ready.append(entry)

    # -- delivery -----------------------------------------------------------

    def take(self, name: str, consumer: Consumer | None, max_messages: int,
             deadline: float, max_bytes: int = 0) -> list[Delivery]:
        """Lease up to ``max_messages`` ready entries for ``deadline`` seconds, oldest first.

        ``consumer`` (a stream) bounds the batch by its room; ``None`` is a
        unary Pull. ``max_bytes`` (0: none) bounds the batch's message
        sizes, but for its first message. Several entries of one ordering
        key may be in one batch, in order; a key another stream holds is
        passed over (invariant 4). Raises ``NOT_FOUND`` if the
        subscription is gone.
        """
        sub = self._get(name)
        now = self.clock()
        taken: list[Delivery] = []
        passed: list[_Entry] = []  # entries of keys another stream holds
        size = 0
        while sub.ready and len(taken) < max_messages:
            entry = sub.ready[0]
            key = sub.key_of(entry)
            if key is not None and key.owner is not None and key.owner is not consumer:
                passed.append(sub.ready.popleft())
                continue
            if consumer is not None and not consumer.has_room_for(entry.message.size):
                break
            size += entry.message.size
            if max_bytes and taken and size > max_bytes:
                break
            sub.ready.popleft()
            taken.append(self._lease(sub, entry, consumer, now + deadline))
            if key is not None:
                key.sent += 1
                if key.sent < len(key.entries):  # the key's next entry may follow at once
                    sub.ready.append(key.entries[key.sent])
        sub.ready.extendleft(reversed(passed))
        return taken

    def _lease(self, sub: _Subscription, entry: _Entry, consumer: Consumer | None,
               deadline: float) -> Delivery:
        entry.attempts += 1
        entry.acked = False
        lease = Delivery(f"{entry.seq}-{entry.attempts}", entry, deadline, consumer)
        entry.lease = lease
        sub.leases[lease.ack_id] = lease
        heapq.heappush(sub.deadlines, (lease.deadline, lease.ack_id))
        if consumer is not None:
            consumer.messages += 1
            consumer.bytes += entry.message.size
        key = sub.key_of(entry)
        if key is not None:
            key.leased += 1
            if consumer is not None:
                key.owner = consumer
        return lease

    def acknowledge(self, name: str, ack_ids: Iterable[str]) -> list[str]:
        """End these leases as done; return the ack ids that named no live lease (ignored)."""
        sub = self._get(name)
        stale: list[str] = []
        for ack_id in ack_ids:
            lease = sub.leases.get(ack_id)
            if lease is None:
                stale.append(ack_id)
                continue
            self._end_lease(sub, lease)
            self._acked(sub, lease.entry)
        self.on_change(name)
        return stale

    def modify_deadline(self, name: str, ack_ids: Iterable[str], seconds: float) -> list[str]:
        """Give these leases ``seconds`` from now; 0 is a nack. Return the stale ack ids."""
        if not 0 <= seconds <= 600:
            raise Refused("INVALID_ARGUMENT", f"ack deadline {seconds} s is outside 0..600")
        sub = self._get(name)
        now = self.clock()
        stale: list[str] = []
        for ack_id in ack_ids:
            lease = sub.leases.get(ack_id)
            if lease is None:
                stale.append(ack_id)
            elif seconds == 0:
                self._fail(sub, lease, now)
            else:
                lease.deadline = now + seconds
                heapq.heappush(sub.deadlines, (lease.deadline, ack_id))
        return stale

    def expire(self) -> None:
        """Fail the leases whose deadline passed; make backed-off entries ready again."""
        now = self.clock()
        for sub in list(self._subscriptions.values()):
            while sub.deadlines and sub.deadlines[0][0] <= now:
                _, ack_id = heapq.heappop(sub.deadlines)
                lease = sub.leases.get(ack_id)
                if lease is not None and lease.deadline <= now:  # else extended or revoked
                    self._fail(sub, lease, now)
            released = False
            while sub.delayed and sub.delayed[0][0] <= now:
                sub.ready.append(heapq.heappop(sub.delayed)[2])
                released = True
            if released:
                self.on_change(sub.name)

    def lapse(self, name: str, message_ids: Iterable[str] | None = None) -> list[str]:
        """A test hook: end live leases now, as if their ack deadline had just passed.

        ``message_ids`` limits it to the leases of those messages (default:
        every live lease of the subscription). Each lease ends exactly as an
        expiry does: its ack id goes stale, and the message is redelivered
        (after the retry policy's backoff) or dead-lettered on its last
        allowed attempt; on an ordering key, the key's later entries come
        again after it (invariant 3). Returns every ack id that went stale,
        those revoked by a rewind included.
        """
        sub = self._get(name)
        wanted = None if message_ids is None else set(message_ids)
        now = self.clock()
        live = set(sub.leases)
        for lease in [lease for lease in sub.leases.values()
                      if wanted is None or lease.message.message_id in wanted]:
            if lease.ack_id in sub.leases:  # else revoked by an earlier one's rewind
                self._fail(sub, lease, now)
        return [ack_id for ack_id in live if ack_id not in sub.leases]

    def next_due(self) -> float | None:
        """The ``clock`` time of the next deadline or end of backoff, if any."""
        due = [sub.deadlines[0][0] for sub in self._subscriptions.values() if sub.deadlines]
        due += [sub.delayed[0][0] for sub in self._subscriptions.values() if sub.delayed]
        return min(due, default=None)

    def close_consumer(self, name: str, consumer: Consumer) -> None:
        """A stream ended: its leases stay until acked or expired, counted against nobody.

        The ordering keys it held are free for other streams at once.
        """
        sub = self._subscriptions.get(name)
        if sub is None:
            return
        for lease in sub.leases.values():
            if lease.consumer is consumer:
                lease.consumer = None
        for key in sub.keys.values():
            if key.owner is consumer:
                key.owner = None
        consumer.messages = consumer.bytes = 0
        self.on_change(name)

    # -- ends of a lease ----------------------------------------------------

    def _release(self, lease: Delivery) -> None:
        consumer = lease.consumer
        if consumer is not None:
            consumer.messages -= 1
            consumer.bytes -= lease.entry.message.size
            lease.consumer = None

    def _end_lease(self, sub: _Subscription, lease: Delivery) -> None:
        """The lease is over (acked, failed, revoked): its ack id is stale from now on."""
        del sub.leases[lease.ack_id]
        self._release(lease)
        entry = lease.entry
        entry.lease = None
        key = sub.key_of(entry)
        if key is not None:
            key.leased -= 1
            if not key.leased:
                key.owner = None

    def _acked(self, sub: _Subscription, entry: _Entry) -> None:
        """An out entry was acked: gone, unless an earlier entry of its key is not (3)."""
        key = sub.key_of(entry)
        if key is None:
            return
        if key.entries[0] is entry or sub.settings.exactly_once:
            self._drop(sub, key, entry)
        else:
            entry.acked = True

    def _drop(self, sub: _Subscription, key: _Key, entry: _Entry) -> None:
        """Take an out entry off its key for good; move the cursor past acked ones."""
        key.entries.remove(entry)
        key.sent -= 1
        while key.entries and key.entries[0].acked:
            key.entries.popleft()
            key.sent -= 1
        if not key.entries:
            del sub.keys[entry.message.ordering_key]

    def _rewind(self, sub: _Subscription, key: _Key, entry: _Entry) -> None:
        """``entry`` failed: it is the key's next to send; the entries after it come again."""
        at = key.entries.index(entry)
        if key.sent < len(key.entries):
            self._unschedule(sub, key.entries[key.sent])
        for later in list(key.entries)[at + 1:key.sent]:
            if later.lease is not None:
                self._end_lease(sub, later.lease)  # revoked: its ack id is stale
            later.acked = False
        key.sent = at

    def _unschedule(self, sub: _Subscription, entry: _Entry) -> None:
        try:
            sub.ready.remove(entry)
        except ValueError:
            sub.delayed = [item for item in sub.delayed if item[2] is not entry]
            heapq.heapify(sub.delayed)

    def _fail(self, sub: _Subscription, lease: Delivery, now: float) -> None:
        """A nack or an expiry: forward to the dead-letter topic, or redeliver after backoff."""
        self._end_lease(sub, lease)
        entry, settings = lease.entry, sub.settings
        key = sub.key_of(entry)
        if (settings.max_delivery_attempts and entry.attempts >= settings.max_delivery_attempts
                and settings.dead_letter_topic in self.topics):
            if key is not None:
                self._drop(sub, key, entry)
            self._dead_letter(sub, entry)
        else:
            if key is not None:
                self._rewind(sub, key, entry)
            backoff = 0.0
            if settings.maximum_backoff:
                backoff = min(settings.maximum_backoff,
                              settings.minimum_backoff * 2 ** (entry.attempts - 1))
            if backoff > 0:
                heapq.heappush(sub.delayed, (now + backoff, entry.seq, entry))
            else:
                sub.ready.appendleft(entry)
        self.on_change(sub.name)

    def _dead_letter(self, sub: _Subscription, entry: _Entry) -> None:
        message = entry.message
        project, _, subscription_id = sub.name.partition("/subscriptions/")
        attributes = {
            **message.attributes,
            "CloudPubSubDeadLetterSourceDeliveryCount": str(entry.attempts),
            "CloudPubSubDeadLetterSourceSubscription": subscription_id,
            "CloudPubSubDeadLetterSourceSubscriptionProject": project.removeprefix("projects/"),
            "CloudPubSubDeadLetterSourceTopicPublishTime": time.strftime(
                "%Y-%m-%dT%H:%M:%SZ", time.gmtime(message.publish_time)),
        }
        self.publish(sub.settings.dead_letter_topic,
                     [(message.data, attributes, message.ordering_key)])

    # -- a restart (the server's optional --state-file) -----------------------

    def snapshot(self) -> Snapshot:
        """Topics, subscriptions and every unsettled entry, with its attempts; no leases.

        A leased entry is kept as unsettled: after a restart it is delivered
        again (as if its lease had expired), under a new ack id. So is an
        acked entry of an ordering key whose earlier entry is not acked yet
        (invariant 3: the key replays from its first unacked entry).
        """
        next_id = next(self._ids)
        self._ids = itertools.count(next_id)
        subscriptions = []
        for sub in self._subscriptions.values():
            entries = {id(e): e for e in sub.ready}
            entries.update((id(e), e) for _, _, e in sub.delayed)
            entries.update((id(e), e) for key in sub.keys.values() for e in key.entries)
            entries.update((id(lease.entry), lease.entry) for lease in sub.leases.values())
            ordered = sorted(entries.values(), key=lambda e: e.seq)
            subscriptions.append(SubscriptionSnapshot(
                sub.name, sub.settings, sub.topic, sub.spec,
                tuple((e.message, e.attempts) for e in ordered)))
        return Snapshot(next_id, dict(self.topics), tuple(subscriptions))

    def restore(self, snapshot: Snapshot) -> None:
        """Load ``snapshot`` into this state, which must still be empty.

        Every entry is ready again (or held behind the earlier entries of
        its ordering key, in the order it was published); ids continue after
        the snapshot's.
        """
        if self.topics or self._subscriptions:
            raise RuntimeError("restore() needs an empty state")
        self._ids = itertools.count(snapshot.next_id)
        for name, spec in snapshot.topics.items():
            self.topics[name] = spec
            self._attached[name] = set()
        for saved in snapshot.subscriptions:
            sub = _Subscription(saved.name, saved.settings, saved.spec)
            sub.topic = saved.topic
            self._subscriptions[saved.name] = sub
            if saved.topic in self._attached:
                self._attached[saved.topic].add(saved.name)
            for message, attempts in saved.entries:
                self._place(sub, _Entry(message, next(self._ids), attempts))
