"""One error hierarchy for sharedstream.

Every error the library raises on purpose derives from :class:`SharedStreamError`.
Each class is named after what went wrong and says, through ``retryable``,
whether trying the same thing again can help: a subscriber that was
force-failed can be restarted and will see the broker redeliver; a trigger
that returns an unhashable lane will fail the same way every time.
"""

from __future__ import annotations

__all__ = [
    "AckTimeout",
    "BacklogUnavailable",
    "DuplicateSubscription",
    "FilterEnded",
    "InvalidStreamKey",
    "PollTerminated",
    "ProducerContractError",
    "SharedStreamError",
    "StreamStopped",
    "SubscriberFailure",
    "SubscriberOverflow",
]


class SharedStreamError(Exception):
    """Base class of every error sharedstream raises on purpose.

    ``retryable`` tells a caller whether running the same work again can
    succeed (for example after the broker redelivers); ``False`` means the
    cause is in code or configuration and will recur.
    """

    retryable: bool = False


class SubscriberFailure(SharedStreamError):
    """A single subscriber was force-failed; the rest of its group is untouched.

    Raised from the subscriber's shared-stream iterator. Every event the
    subscriber still owed is resolved as *failed*, so the broker redelivers
    it; restarting the trigger is safe.
    """

    retryable = True


class AckTimeout(SubscriberFailure):
    """The subscriber did not resolve an event within the ack timeout.

    Either its filter was still on the event, or some trigger events it
    derived from it were never confirmed persisted.
    """


class SubscriberOverflow(SubscriberFailure):
    """The subscriber's bounded queue was full when a new event was fanned out.

    The filter fell behind the shared poll; rather than block the other
    subscribers or drop events silently, this subscriber alone is failed.
    """


class FilterEnded(SharedStreamError):
    """A durable member's filter returned; a watcher's filter must run until cancelled.

    Raised by ``Membership.run_attempt`` after failing the raw event the
    filter was on (it may not have finished it), so restarting is safe.
    """

    retryable = True


class PollTerminated(SharedStreamError):
    """The shared poll returned instead of yielding forever.

    ``open_shared_stream`` / ``open_stream`` must yield for the lifetime of the
    group or raise; returning would leave subscribers waiting on nothing.
    """

    retryable = True


class StreamStopped(SharedStreamError):
    """The group was stopped (``stop_all``) or the member left its stream.

    Never raised into trigger code: after a stop, a subscriber's iterator
    waits until its task is cancelled (Airflow's shutdown; see
    :mod:`sharedstream.engine.stream`). It is what
    ``Membership.run_attempt`` raises, before any filter runs, once the
    member left or the manager stopped. What was resolved was advanced
    first; the rest will be redelivered.
    """

    retryable = True


class ProducerContractError(SharedStreamError):
    """A trigger or producer broke the shared-stream contract.

    Examples: ``open_stream`` yielded something that is not a
    ``(raw_event, broker_payload)`` pair, or ``get_advance_lane`` returned an
    unhashable value. The group is terminated; the bug is in that code.
    """


class DuplicateSubscription(SharedStreamError, RuntimeError):
    """The same trigger id subscribed twice to a live group."""


class InvalidStreamKey(SharedStreamError, ValueError):
    """A shared-stream key was ``None`` or not hashable."""


class BacklogUnavailable(SharedStreamError):
    """The broker (or this server of it) cannot tell the stream's backlog; the message says why.

    Raised by :meth:`SharedStreamProducer.broker_backlog
    <sharedstream.engine.producer.SharedStreamProducer.broker_backlog>`
    when asking again cannot help (Pub/Sub's API has no backlog; a
    development emulator serves no administration API). Status views show
    the backlog as ``n/a``, not as 0 and not as a failure.
    """

    retryable = False
