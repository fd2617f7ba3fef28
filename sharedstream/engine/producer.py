"""The producer contract: the broker-side half of an ack-mode shared stream.

A :class:`SharedStreamProducer` owns one broker connection for the lifetime
of one poll. The engine drives it through four calls, always from one event
loop and never concurrently with itself:

1. ``open_stream()`` - once; an async generator of ``(raw_event,
   broker_payload)`` pairs that yields forever or raises.
2. ``get_advance_lane(broker_payload)`` - once per pair, synchronously,
   before the raw event is fanned out.
3. ``advance(batch)`` - whenever a lane has a contiguous prefix of fully
   resolved events; at most one call is awaited at any moment.
4. ``aclose()`` - exactly once when the poll ends, best-effort.

Ack decisions are data: each batch item carries an :class:`AdvanceOutcome`
with the counts of how the subscribers resolved the event, and the
producer alone decides what that means for its broker (commit, delete,
dead-letter, nack, ...).
"""

from __future__ import annotations

import abc
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Collection,
    Hashable,
    Mapping,
    Sequence,
)
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

from sharedstream.engine.errors import BacklogUnavailable
from sharedstream.engine.replay import ReplaySource

__all__ = [
    "MAX_ADVANCE_ITEMS",
    "AdvanceItem",
    "AdvanceOutcome",
    "BrokerBacklog",
    "DeadLetter",
    "DeadLetterFallback",
    "FailureLedger",
    "SharedStreamProducer",
    "Verdict",
    "annotated_outcome",
    "outcome_with_unseen",
    "verdict_detail",
    "verdict_triggers",
]

MAX_ADVANCE_ITEMS = 1000
"""Most items in one :meth:`SharedStreamProducer.advance` call that carries several lanes."""


class AdvanceOutcome(NamedTuple):
    """How the subscribers that were online at fan-out resolved one event.

    Each such subscriber is counted in exactly one field, so the three sum
    to the size of the fan-out snapshot:

    * ``acked`` - moved past the event, and every trigger event it derived
      from it was confirmed persisted;
    * ``failed`` - force-failed (queue overflow, ack timeout) or left before
      pulling the event: redelivery is the usual answer;
    * ``rejected`` - refused it with :func:`reject_shared_stream_event`:
      dead-letter or discard it, do not redeliver.

    :attr:`unseen` says how many of the failures are not the event's doing.
    """

    acked: int
    failed: int
    rejected: int = 0

    @property
    def is_clean(self) -> bool:
        """True when at least one subscriber acked and none failed or rejected.

        An event fanned out to nobody (all counts zero) is not clean: nothing
        accepted it.
        """
        return self.acked > 0 and self.failed == 0 and self.rejected == 0

    @property
    def unseen(self) -> int:
        """How many of the ``failed`` subscribers never had the event in their filter.

        They failed or left with the event still queued for them: their
        filter raised on an earlier event, they fell behind (overflow), or an
        earlier event timed out. Such a failure says nothing about this
        event, so a producer that counts failures toward a poison-message
        limit should count only ``failed - unseen``. Not part of the tuple
        (the three counts stay what they are): 0 unless the engine says
        otherwise.
        """
        return 0

    @property
    def failed_itself(self) -> bool:
        """Whether a subscriber failed on the event itself (``failed > unseen``).

        Only such a failure counts toward a poison-message limit.
        """
        return self.failed > self.unseen

    @property
    def verdicts(self) -> tuple[Verdict, ...]:
        """Who failed on the event itself or rejected it, and why.

        One :class:`Verdict` per subscriber whose failure was the event's
        doing (its filter raised or hung on it) or that rejected it, so a
        producer can name them in dead-letter headers. Unseen failures
        have none. Empty unless the engine says otherwise.
        """
        return ()

    @property
    def failed_by(self) -> tuple[Hashable, ...] | None:
        """The trigger ids of the ``failed`` subscribers, or ``None`` when not known.

        One id per failure, in resolution order (seen and unseen alike). The
        engine names them on every outcome it builds; ``None`` only for an
        outcome with failures built without them (a test's plain tuple), so
        a producer must then assume anyone may still need the event.
        """
        return () if not self.failed else None

    def needed_by(self) -> frozenset[Hashable] | None:
        """Who did not resolve the event as done: failed or rejected it (``None``: unknown).

        The subscribers that acked it have stored everything they derived
        from it; a redelivery needs to reach only these (see
        :meth:`SharedStreamProducer.delivery_audience`). Empty when everyone
        acked.
        """
        failed = self.failed_by
        if failed is None or len(failed) != self.failed:
            return None
        rejected = [v.trigger_id for v in self.verdicts if v.resolution == "rejected"]
        if len(rejected) != self.rejected:
            return None
        return frozenset((*failed, *rejected))


class Verdict(NamedTuple):
    """One subscriber's non-clean resolution of one event (see :attr:`AdvanceOutcome.verdicts`)."""

    trigger_id: Hashable
    """The subscriber (the runtime's trigger id)."""

    resolution: str
    """``"failed"`` or ``"rejected"``."""

    reason: str
    """Why, in one line (``"RuntimeError: boom"``, ``"undecodable json value: ..."``)."""


def verdict_triggers(verdicts: Sequence[Verdict]) -> tuple[str, ...]:
    """The trigger ids the verdicts name, as text, each once, in order (for dead letters)."""
    return tuple(dict.fromkeys(str(v.trigger_id) for v in verdicts))


def verdict_detail(verdicts: Sequence[Verdict]) -> str:
    """What the verdicts say, each reason once, ``; ``-separated (empty when none)."""
    return "; ".join(dict.fromkeys(v.reason for v in verdicts))


class _Annotated(AdvanceOutcome):
    """An :class:`AdvanceOutcome` with unseen failures or verdicts (built by the engine)."""

    @property
    def unseen(self) -> int:
        unseen: int = self.__dict__.get("_unseen", 0)
        return unseen

    @property
    def verdicts(self) -> tuple[Verdict, ...]:
        verdicts: tuple[Verdict, ...] = self.__dict__.get("_verdicts", ())
        return verdicts

    @property
    def failed_by(self) -> tuple[Hashable, ...] | None:
        failed_by: tuple[Hashable, ...] | None = self.__dict__.get("_failed_by")
        return failed_by if failed_by is not None else super().failed_by

    def __repr__(self) -> str:
        return (f"AdvanceOutcome(acked={self.acked}, failed={self.failed}, "
                f"rejected={self.rejected}, unseen={self.unseen}, verdicts={self.verdicts!r})")


def annotated_outcome(
    acked: int, failed: int, rejected: int, *, unseen: int = 0,
    verdicts: tuple[Verdict, ...] = (), failed_by: tuple[Hashable, ...] | None = None,
) -> AdvanceOutcome:
    """The outcome ``(acked, failed, rejected)`` with unseen failures, verdicts and who failed.

    For the engine and for tests; equal, as a tuple, to the plain outcome.
    ``failed_by`` names the failed subscribers (:attr:`AdvanceOutcome.failed_by`).
    """
    outcome = _Annotated(acked, failed, rejected)
    outcome.__dict__["_unseen"] = min(unseen, failed)
    outcome.__dict__["_verdicts"] = verdicts
    outcome.__dict__["_failed_by"] = failed_by
    return outcome


def outcome_with_unseen(acked: int, failed: int, rejected: int, unseen: int) -> AdvanceOutcome:
    """:func:`annotated_outcome` with unseen failures only."""
    return annotated_outcome(acked, failed, rejected, unseen=unseen)


class AdvanceItem(NamedTuple):
    """One fully resolved event in a batch handed to :meth:`SharedStreamProducer.advance`."""

    broker_payload: Any
    """What ``open_stream`` yielded beside the raw event (offset, receipt handle, ...)."""

    outcome: AdvanceOutcome
    """How the subscribers resolved the event."""


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A raw event the broker's own dead-letter destination would not take.

    Handed by a producer to its :data:`DeadLetterFallback` so the event is
    kept somewhere durable before the broker is advanced past it.
    """

    stream: str
    """Which stream it came from, as the producer names it (``"kafka orders"``)."""

    source: str
    """The producer's stable name of the raw event (``"orders/0/42"``, a message id)."""

    reason: str
    """Why it was dead-lettered, and why the broker refused it."""

    triggers: tuple[str, ...]
    """The triggers (ids, as text) that rejected it or kept failing on it."""

    payload: bytes
    """The raw event's body, whole; the keeper may store only a prefix of it."""

    headers: tuple[tuple[str, bytes], ...] = ()
    """Broker headers or attributes, as ``(name, value)`` pairs."""


BrokerBacklog = Mapping[str, Mapping[str, int]]
"""The broker's own count of what waits for the stream: lane (as text) -> kind -> messages.

Kinds are the broker's own words (``lag`` for Kafka; ``visible``,
``in_flight`` and ``dead_letter`` for SQS; ``active`` and ``dead_letter``
for Service Bus); each broker module documents its lanes and kinds. See
:meth:`SharedStreamProducer.broker_backlog`.
"""


DeadLetterFallback = Callable[[DeadLetter], Awaitable[None]]
"""Keeps a :class:`DeadLetter` durably; returns once it is stored, raises if it was not."""


class FailureLedger(Protocol):
    """A durable count of each raw event's own failures, by its producer's ``raw_event_name``.

    The runtime offers one (its store); the engine sets it on producers that
    :attr:`~SharedStreamProducer.counts_deliveries`. It survives restarts, so
    a producer can tell a message that failed too often from one the broker
    delivered too often because the process holding it died.
    """

    async def add(self, names: Sequence[str]) -> None:
        """Count one more failure against each name (twice if listed twice), durably.

        Raises when it could not (nothing is counted then).
        """
        ...

    async def counts(self, names: Sequence[str]) -> Mapping[str, int]:
        """The failures counted against those of ``names`` that have any; raises on failure."""
        ...


class SharedStreamProducer(abc.ABC):
    """Broker-side half of an ack-mode shared stream.

    Built by ``BaseEventTrigger.create_shared_stream_producer(kwargs)`` once
    per group. The constructor must not connect: connect inside
    :meth:`open_stream`.

    ``dead_letter_fallback`` is set by the engine before :meth:`open_stream`
    when the runtime offers one (``None`` otherwise): where a raw event goes
    when the broker's dead-letter destination refuses it for good (too big,
    say), so it is neither lost nor left to stall its lane.
    """

    dead_letter_fallback: DeadLetterFallback | None = None

    stream_name: str = "an unnamed stream"
    """The stream's name (:mod:`sharedstream.engine.names`), for log lines and dead letters.

    Set by the engine before :meth:`open_stream`; a producer names its stream
    with it and never builds a name of its own, so every line agrees.
    """

    counts_deliveries: bool = False
    """Whether the broker counts each message's deliveries and the producer judges poison by it.

    ``True`` for brokers that redeliver one message at a time with a count
    (Pub/Sub, Service Bus, SQS). The engine then records each raw event a
    subscriber failed on itself (:attr:`AdvanceOutcome.failed_itself`) in
    :attr:`failure_ledger` before handing the batch to :meth:`advance`, so
    the producer can ask, of a message delivered too often, how many of
    those deliveries were its own failures.
    """

    failure_ledger: FailureLedger | None = None
    """Set by the engine before :meth:`open_stream` when :attr:`counts_deliveries` and the
    runtime offers one; ``None`` otherwise."""

    dead_lettered: int = 0
    """Raw events this producer dead-lettered (to the broker or its fallback) so far.

    Producers that dead-letter increment it; the engine reads it after each
    ``advance`` to total it up for the runtime.
    """

    advances_lanes_together: bool = False
    """Whether one :meth:`advance` call may carry several lanes' batches.

    ``False`` (the default): each call is one lane's resolved prefix. A
    producer that settles every message on its own, whatever its lane, may
    say ``True``: the engine then hands it the resolved prefixes of every
    ready lane in one call (each lane's items contiguous and in order, up
    to :data:`MAX_ADVANCE_ITEMS` items), which saves a call per message
    where most lanes hold one message (Pub/Sub and Service Bus messages
    without an ordering key or session).
    """

    @abc.abstractmethod
    def open_stream(self) -> AsyncIterator[tuple[Any, Any]]:
        """Connect and yield ``(raw_event, broker_payload)`` pairs, forever.

        Implemented as an async generator. Called once per poll. Returning is
        an error (subscribers see :class:`PollTerminated`); raising ends the
        group, and every subscriber sees the exception. Cancellation (the
        group stopping) arrives as ``CancelledError`` at an ``await`` inside it.
        """

    @abc.abstractmethod
    async def advance(self, batch: Sequence[AdvanceItem]) -> None:
        """Advance the broker for one lane's batch of fully resolved events.

        ``batch`` is never empty; its items are in fan-out order and are the
        lane's contiguous resolved prefix (several lanes' prefixes, one after
        another, when :attr:`advances_lanes_together` says so). Within a lane
        the next batch comes only after this call returned; across all lanes
        at most one call is awaited at any moment. Committing the last item
        of a batch therefore never skips an unresolved event of that lane.

        If this raises, the whole group is terminated: every subscriber gets
        the exception, nothing further is advanced, and the broker redelivers
        whatever was not advanced. Handle per-message broker errors here and
        raise only when the connection itself is broken.

        The broker action may be deferred: ``advance`` may hand it to a task
        the producer owns and return first (the Kafka producer coalesces
        commits this way). Every event handed over is already stored, so a
        crash before the action completes only causes redelivery. Such a
        task must not swallow a lasting failure: raise it from the next
        ``advance`` call or from ``open_stream``, and let ``aclose`` finish
        or abandon what is pending.
        """

    def get_advance_lane(self, broker_payload: Any) -> Hashable:
        """Return the lane of one event; events of different lanes never wait for each other.

        Called synchronously once per event before fan-out, so it must be
        O(1) and must not block. The default puts every event in one lane
        (a single global order). Raising, or returning an unhashable value,
        fails the poll.
        """
        return None

    def delivery_audience(self, broker_payload: Any) -> Collection[Hashable] | None:
        """The trigger ids a redelivered event is for, or ``None`` for every subscriber.

        Asked once per event before its fan-out, synchronously, only when a
        producer overrides it (the default costs nothing). A producer that
        knows who already resolved an earlier delivery of this very event
        (from :meth:`AdvanceOutcome.needed_by`) names the others, so a retry
        reaches only the watchers that failed on it: the rest resolve it as
        acked at once, without seeing it again. Returning a subscriber that
        acked is harmless (its events are stored under the same keys);
        leaving out one that did not would lose the event for it, so when in
        doubt return ``None``. Must be O(1) and must not raise.
        """
        return None

    def raw_event_name(self, broker_payload: Any) -> str | None:
        """Name the raw event uniquely and stably across redeliveries, or ``None``.

        For example ``"orders/3/1042"`` (topic/partition/offset) or an SQS
        message id. The runtime stores each trigger event derived from the
        raw event under a key made of the trigger, this name and the event's
        index, so a redelivered message creates no second asset event or DAG
        run. ``None`` (the default) means events are stored as they come
        (at-least-once). Called synchronously on the runner's hot path.

        A name alone cannot tell a redelivery from a *new* message that got
        the same name (a recreated topic reuses offsets, a recreated entity
        restarts its sequence numbers); a producer whose names can repeat
        also implements :meth:`raw_event_fingerprint`.
        """
        return None

    def raw_event_fingerprint(self, broker_payload: Any) -> str | None:
        """What tells this message from others with the same :meth:`raw_event_name`, or ``None``.

        Asked once per named raw event, on the hot path, right after
        :meth:`raw_event_name`: it must be cheap (no I/O, a digest of bytes
        at most), must not raise, and must return the same text for every
        redelivery of the message and (as far as a short digest can) a
        different one for any other message. The store keeps it beside the
        event; a later event whose key matches a stored one but whose
        fingerprint differs is stored under a new key with a warning, not
        dropped as a duplicate (see :class:`~sharedstream.store.base.PendingEvent`).

        ``None`` (the default): the name alone identifies the message, as
        when the broker assigns names that never repeat (Pub/Sub and SQS
        message ids).
        """
        return None

    def trace_carrier(self, raw_event: Any, broker_payload: Any) -> Mapping[str, str] | None:
        """The message's trace context as a text map (``traceparent``, ...), or ``None``.

        ``raw_event`` and ``broker_payload`` are one pair ``open_stream`` yielded.
        Read only when tracing is on (see :mod:`sharedstream.engine.tracing`),
        once per raw event, with the globally configured propagator: the
        message's headers, attributes or application properties, keys in
        lower case (:func:`~sharedstream.engine.tracing.carrier_of` builds one).
        ``None`` (the default): the raw event starts a new trace.
        """
        return None

    @property
    def messaging_attributes(self) -> Mapping[str, str]:
        """OpenTelemetry messaging attributes of every span of this stream.

        ``messaging.system`` (``kafka``, ``aws_sqs``, ``gcp_pubsub``,
        ``servicebus``), ``messaging.destination.name`` (topic, queue,
        subscription) and ``messaging.consumer.group.name`` where there is
        one. Empty by default (the destination is then the stream's key).
        """
        return {}

    @property
    def connected(self) -> bool | None:
        """Whether the producer is connected to its broker right now, if it can tell.

        ``True``: its consumer is in its group, its receiver open;
        ``False``: it is (re)connecting, the broker away; ``None`` (the
        default): it cannot tell, and a live poll counts as connected. Read
        by readiness checks and status views on the event loop, any time
        between :meth:`open_stream` and :meth:`aclose`; must be cheap and
        must not raise.
        """
        return None

    async def broker_backlog(self) -> BrokerBacklog:
        """What the broker itself holds for this stream, by lane and kind (:data:`BrokerBacklog`).

        The broker's view, not the process's: a Kafka group's lag (log end
        offset minus committed offset, per partition), a queue's message
        counts. Asked by the runtime every ``[api] backlog_interval``
        seconds, between :meth:`open_stream` and :meth:`aclose`, never on
        the hot path and never twice at once; it may run while
        :meth:`open_stream` or :meth:`advance` is awaited, so it only reads
        (metadata calls on the producer's client, or a client of its own
        that it closes before returning). Must not change what is
        delivered or committed.

        The runtime bounds each call with a timeout and shows the backlog
        as unknown when it raises or times out. Raise
        :class:`~sharedstream.engine.errors.BacklogUnavailable` when asking
        cannot help (the broker's API has no such count); the default does,
        so a producer that says nothing shows ``n/a``.
        """
        raise BacklogUnavailable(f"{type(self).__name__} cannot tell its broker's backlog")

    def replay_source(self) -> ReplaySource | None:
        """A bounded reader of this stream for one watcher's replay, or ``None`` (the default).

        Called by the runtime outside any poll, on a producer built by
        ``create_shared_stream_producer`` whose :meth:`open_stream` was not
        called and will not be. The source opens clients of its own; see
        :mod:`sharedstream.engine.replay` for its contracts. ``None``: this
        broker cannot replay (the runtime refuses the replay with one line);
        a producer with a better reason to give raises
        :class:`~sharedstream.engine.replay.ReplayError` saying it instead.
        """
        return None

    def dead_letter_event(self, letter: DeadLetter) -> tuple[Any, Any] | None:
        """The ``(raw_event, broker_payload)`` live for a kept dead letter, or ``None``.

        Called by the runtime for a replay of a watcher's dead letters
        (``sharedstream watchers replay WATCHER --dead-letters``), on a
        producer built by ``create_shared_stream_producer`` whose
        :meth:`open_stream` was not called and will not be; no I/O, must not
        raise. ``letter`` is one this producer's stream kept (its whole
        payload). The raw event is what a filter received live (same type,
        body, headers or attributes as kept); what the letter does not keep
        the broker module says. :meth:`raw_event_name` of the payload must
        give the name the live message had, so an event the watcher stored
        already is not stored again, and :meth:`raw_event_fingerprint` the
        live fingerprint or ``None`` (then the store matches by name alone),
        never another one. The payload is never advanced.

        ``None`` (the default): this broker cannot rebuild a dead letter (the
        replay fails with one line saying so; also for a letter it cannot
        rebuild, such as one of another stream).
        """
        del letter
        return None

    async def republish(self, letters: Sequence[DeadLetter]) -> None:
        """Publish kept dead letters again to the stream this producer consumes, as new messages.

        Called by ``sharedstream deadletters redrive``, outside any poll: the
        producer was built by ``create_shared_stream_producer`` but
        :meth:`open_stream` was not called and will not be. The method opens
        a client of its own and closes it before it returns or raises. It
        may be called again on the same producer, never concurrently.

        Each letter's ``payload`` and ``headers`` are sent as kept, in the
        given order, each as a *new* message (a new offset, message id or
        sequence number) of the source its ``source`` names; ``reason`` and
        ``triggers`` are not sent. What else survives (a key, an ordering
        key, a session, attribute types) the broker module says. A letter
        that cannot belong to this stream or cannot be sent as kept is
        refused before anything is published.

        Not idempotent: a second call publishes second copies. The store's
        idempotency keys name a raw event by :meth:`raw_event_name` (an
        offset, a message id, a sequence number), which each copy has anew,
        so a second copy fires its events again, unless the broker itself
        drops it (a module says where: a FIFO queue's deduplication window).

        Raises the broker module's error (a ``BrokerError`` subclass of
        :mod:`sharedstream.brokerkit.errors`, wrapping the SDK's) when
        connecting or publishing fails after bounded retries, or a letter is
        refused; by then some, all or none of the letters may be published.
        The default raises :class:`NotImplementedError`: this producer
        cannot republish.
        """
        raise NotImplementedError(f"{type(self).__name__} cannot republish dead letters")

    async def aclose(self) -> None:  # noqa: B027 - optional hook, empty by default
        """Release broker resources. Called exactly once when the poll ends.

        Best-effort: an exception is logged and not propagated. Resolved
        events were already advanced before this call.
        """
