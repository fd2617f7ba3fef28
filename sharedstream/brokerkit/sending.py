"""Sending messages to a broker: what ``sharedstream send`` and the demo publish with.

Each broker module has one :class:`Sender` (``sharedstream.producers._kafka_send``,
``_sqs_send``, ``_pubsub_send``, ``_servicebus_send``; the CLI picks one by
name) that turns :class:`OutgoingMessage` values into that broker's messages
with its real SDK. A message is a body plus what every broker can carry beside it, under
one name each:

* ``properties`` - Kafka headers, SQS message attributes (``String``),
  Pub/Sub attributes, Service Bus application properties;
* ``key`` - the Kafka record key, the SQS FIFO message group id, the
  Pub/Sub ordering key, the Service Bus session id: what orders messages
  among themselves;
* ``dedup_id`` - the SQS FIFO deduplication id (no other broker has one).

Invariants: a sender module imports its SDK only inside methods (it
imports without its broker's extra); where to connect comes from the
same settings and Airflow-style connections the broker's trigger reads
(``conn_id``, see :mod:`sharedstream.connections.settings`), so a connection
that works for a watcher works for ``send``. A sender's calls, in order:
:meth:`Sender.open`, :meth:`Sender.send` any number of times (one batch
each, returning once the broker acknowledged all of it), :meth:`Sender.close`
(always, also after a failure; idempotent). Errors: what the user can fix
(settings, a missing SDK) is a :class:`~sharedstream.brokerkit.errors.BrokerConfigError`;
a broker that cannot be reached a :class:`SendConnectError` naming its
address; a broker that refuses or fails a batch a :class:`SendFailed`. Each
is one line.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import islice
from typing import Any, ClassVar, Protocol

from sharedstream.brokerkit.errors import BrokerConnectError, BrokerRequestError

__all__ = ["OutgoingMessage", "SendConnectError", "SendFailed", "Sender", "send_all"]


@dataclass(frozen=True)
class OutgoingMessage:
    """One message to send; see the module docstring for what each field is on each broker."""

    body: bytes
    properties: tuple[tuple[str, str], ...] = ()
    """``(name, value)`` pairs, in order; of a name given twice, the broker keeps the last
    (Kafka keeps both: headers are a list)."""
    key: str | None = None
    dedup_id: str | None = None


class SendConnectError(BrokerConnectError):
    """The broker could not be reached; the message names the address tried."""


class SendFailed(BrokerRequestError):
    """The broker refused or failed a batch (the batches before it were sent)."""


class Sender(Protocol):
    """Sends batches of :class:`OutgoingMessage` to one destination of one broker.

    Built by :meth:`from_options` (no I/O), then used as the module
    docstring says. Not safe for concurrent :meth:`send` calls.
    """

    broker: ClassVar[str]
    options: ClassVar[frozenset[str]]
    """The ``sharedstream send`` options this broker takes (their ``argparse`` dests)."""
    key_option: ClassVar[str | None]
    """The option that sets :attr:`OutgoingMessage.key` (``key``, ``session_id``...)."""
    batch_size: ClassVar[int]
    """Messages per :meth:`send` call that the broker takes in one request (or a few)."""

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> Sender:
        """A sender for ``options`` (dest -> value, ``None`` when not given).

        Resolves ``conn_id`` through the configuration's connections and
        imports the SDK: raises ``BrokerConfigError`` (one line, the ``pip
        install`` to run when the SDK is missing) for what the user must fix.
        """

    @property
    def destination(self) -> str:
        """Where messages go, for people: ``kafka topic orders``."""

    async def open(self) -> None:
        """Connect; :class:`SendConnectError` naming the address when the broker is unreachable."""

    async def send(self, batch: Sequence[OutgoingMessage]) -> None:
        """Send ``batch`` in order; return once the broker acknowledged every message of it.

        Raises :class:`SendFailed` (or :class:`SendConnectError`) otherwise.
        """

    async def close(self) -> None:
        """Release the clients :meth:`open` made; idempotent, also after a failed open."""


def _batches(messages: Iterable[OutgoingMessage], size: int) -> Iterator[list[OutgoingMessage]]:
    it = iter(messages)
    while batch := list(islice(it, size)):
        yield batch


async def send_all(sender: Sender, messages: Iterable[OutgoingMessage],
                   sent: Callable[[int], None] = lambda _: None) -> int:
    """Send ``messages`` in batches of ``sender.batch_size``; return how many were sent.

    ``messages`` is read lazily, one batch ahead at most, so a large file is
    never held in memory; ``sent(n)`` is called after each acknowledged
    batch. The sender must be open; it is not closed here. Raises what
    :meth:`Sender.send` raises (the batches before were sent, and counted
    by ``sent``).
    """
    total = 0
    for batch in _batches(messages, sender.batch_size):
        await sender.send(batch)
        total += len(batch)
        sent(len(batch))
    return total
