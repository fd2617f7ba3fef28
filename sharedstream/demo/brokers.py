"""What the demo needs from a broker: :class:`DemoBroker`, and the registry of them.

The demo itself (configuration, triggerer, progress, summary, Ctrl-C, clean-up,
exit codes) is one piece of code in :mod:`sharedstream.demo`; everything that
differs per broker is here, behind one small interface:

* the **run side** - start and stop the broker, create the stream and its
  dead-letter destination, produce the demo records, read how far the broker
  advanced (for the progress line and the summary), count the dead letters;
* the **definitions side** - :meth:`DemoBroker.watcher_triggers`: the trigger
  class the four watchers are built from, its connection kwargs and how a
  region is matched, read from the environment that :meth:`DemoBroker.environment`
  gives the triggerer (so ``sharedstream triggerer --definitions`` works too).

Invariants: a broker module imports its SDK only inside methods (the demo
package must import without any broker extra), and :meth:`DemoBroker.stop`
is idempotent and safe from a signal handler. A broker joins the demo with one
module and one line in :data:`DEMO_BROKERS`.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Protocol

from sharedstream.brokerkit.sending import OutgoingMessage, Sender, send_all
from sharedstream.engine.errors import SharedStreamError

__all__ = ["DEMO_BROKERS", "DemoBroker", "WatcherTriggers", "demo_broker", "produce_with",
           "require_modules"]

TOPIC = "demo.orders"
"""The stream of the demo (a Kafka topic, a Pub/Sub topic and subscription, a Service Bus queue)."""
DEAD_LETTERS = f"{TOPIC}.dlq"


@dataclass(frozen=True)
class WatcherTriggers:
    """How the demo definitions build their watchers on one broker."""

    base: type[Any]
    """The broker's trigger class (a ``BrokerTrigger``); the custom filter subclasses it."""
    common: dict[str, Any]
    """Kwargs every watcher passes: where the broker is, the stream, ``payload_format``."""
    region: Callable[[str], dict[str, Any]]
    """``match`` conditions that hold for the records of one region (``eu``, ``us``...)."""


class DemoBroker(Protocol):
    """One broker of ``sharedstream demo``.

    The demo calls, in order: :meth:`check_installed`, :meth:`start` (outside
    the event loop), :meth:`environment`, then inside one event loop
    :meth:`create_stream`, :meth:`produce` (in a task of its own, concurrently
    with :meth:`advanced` every 0.5 s), :meth:`dead_letters`, :meth:`close`;
    and finally :meth:`stop`, on every exit path, possibly twice and possibly
    from a signal handler after :func:`os._exit` was decided.
    """

    name: ClassVar[str]
    advanced_label: ClassVar[str]
    """What :meth:`advanced` counts, in the progress line (``consumed and committed``)."""
    waiting_label: ClassVar[str]
    """The progress line's phase before anything is advanced."""
    dead_letters_at: ClassVar[str]
    """Where rejected records go, for the summary (``topic demo.orders.dlq``)."""

    @classmethod
    def check_installed(cls) -> None:
        """Raise ``SharedStreamError`` naming what to install when the SDK or broker is missing."""

    @classmethod
    def watcher_triggers(cls, environ: Mapping[str, str]) -> WatcherTriggers:
        """The definitions side; imports the broker's trigger module (not its SDK)."""

    def start(self, workdir: Path) -> str:
        """Start the broker (its files under ``workdir``); return a line saying where it is."""

    def stop(self, *, at_once: bool = False) -> None:
        """Stop the broker; idempotent, quick, never raises.

        ``at_once`` (a second Ctrl-C): kill it without waiting for it to end
        gracefully; the demo exits right after and throws its state away.
        """

    def environment(self) -> dict[str, str]:
        """The variables that point :meth:`watcher_triggers` at this broker's stream."""

    async def create_stream(self) -> None:
        """Create the stream and the dead-letter destination; open what :meth:`advanced` reads."""

    async def produce(self, messages: int, sent: Callable[[int], None]) -> None:
        """Publish demo records ``0..messages-1``; ``sent(n)`` after each acknowledged batch."""

    async def advanced(self) -> int:
        """How many records the broker counts as done (committed, acked); never decreases."""

    async def dead_letters(self, at_least: int) -> int:
        """The records in the dead-letter destination, waiting a few seconds for ``at_least``."""

    async def close(self) -> None:
        """Close the clients :meth:`create_stream` opened; the broker keeps running."""


def require_modules(modules: Sequence[str], *, support: str, hint: str) -> None:
    """Check that a broker's SDK is installed, for :meth:`DemoBroker.check_installed`.

    Raises ``SharedStreamError`` ("the demo needs ``support`` support:
    ``hint``") unless every module of ``modules`` can be found; none is imported.
    """
    for module in modules:
        try:
            found = importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:  # its parent package (google, azure) is missing
            found = False
        if not found:
            raise SharedStreamError(f"the demo needs {support} support: {hint}")


async def produce_with(sender: Sender, messages: Iterable[OutgoingMessage],
                       sent: Callable[[int], None]) -> None:
    """:meth:`DemoBroker.produce` with the broker's sender (``sharedstream send``'s).

    Opens ``sender``, sends ``messages`` in its batches (``sent(n)`` after
    each acknowledged one) and closes it, whether it ends, fails or is
    cancelled.
    """
    await sender.open()
    try:
        await send_all(sender, messages, sent)
    finally:
        await sender.close()


DEMO_BROKERS: Mapping[str, str] = {
    "kafka": "sharedstream.demo.kafka:KafkaDemoBroker",
    "pubsub": "sharedstream.demo.pubsub:PubSubDemoBroker",
    "servicebus": "sharedstream.demo.servicebus:ServiceBusDemoBroker",
}
"""``--broker`` name -> its :class:`DemoBroker` (imported when chosen)."""


def demo_broker(name: str) -> type[DemoBroker]:
    """The :class:`DemoBroker` class of ``name``; ``KeyError`` for an unknown one."""
    module, _, attribute = DEMO_BROKERS[name].partition(":")
    broker: type[DemoBroker] = getattr(importlib.import_module(module), attribute)
    return broker
