"""Sending to a Google Pub/Sub topic (``sharedstream send --broker pubsub``, the demo).

Where to connect is the Pub/Sub trigger's: ``project``, ``emulator_host``
and ``tls_ca_file`` given, or from a ``google_cloud_platform`` connection (``conn_id``, read by
:func:`~sharedstream.triggers.pubsub.pubsub_settings_from_connection`), the
emulator host else from ``PUBSUB_EMULATOR_HOST``, else Google's endpoint
with Application Default Credentials; the client is the producer's
(:func:`~sharedstream.producers.pubsub.pubsub_clients`). A batch is one
``Publish`` request (Pub/Sub takes up to 1,000 messages and 10 MB in one):
each message's properties become its attributes and its ``key`` its
ordering key (a subscription delivers a key's messages in order only when
it was created with message ordering on).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from sharedstream.brokerkit.sdk import OptionalSdk
from sharedstream.brokerkit.sending import OutgoingMessage, SendConnectError, SendFailed
from sharedstream.connections.settings import resolve_inline
from sharedstream.producers._pubsub_client import pubsub_clients
from sharedstream.producers._pubsub_types import PubSubConfigError, resource_path
from sharedstream.triggers.pubsub import pubsub_settings_from_connection

__all__ = ["PubSubSender"]

_sdk = OptionalSdk(broker="Pub/Sub", package="google.pubsub_v1", extra="pubsub",
                   error=PubSubConfigError, user="sending to Pub/Sub")
_TIMEOUT = 30.0
"""Seconds one call may take (a publish of a full batch included)."""


class PubSubSender:
    """Messages to one topic, one ``Publish`` request per batch."""

    broker: ClassVar[str] = "pubsub"
    options: ClassVar[frozenset[str]] = frozenset(
        {"topic", "project", "ordering_key", "emulator_host", "tls_ca_file", "conn_id"})
    key_option: ClassVar[str | None] = "ordering_key"
    batch_size: ClassVar[int] = 500

    def __init__(self, *, project: str, topic: str, emulator_host: str | None,
                 tls_ca_file: str | None = None) -> None:
        """Send to ``topic`` of ``project`` (or a full topic path); no I/O yet.

        ``tls_ca_file``: reach the emulator host over TLS, trusting these
        authorities (see :func:`~sharedstream.producers.pubsub.pubsub_clients`).
        """
        _sdk()
        self.path = resource_path(project, "topics", topic)
        self.host = emulator_host or os.environ.get("PUBSUB_EMULATOR_HOST") or None
        self.tls_ca_file = tls_ca_file
        self.client: Any = None
        """The publisher client once :meth:`open` made it (the demo creates topics with it)."""

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> PubSubSender:
        """``topic`` and ``project`` (each required: inline, or the connection's project)."""
        if not options.get("topic"):
            raise PubSubConfigError("sending to Pub/Sub needs --topic")
        inline = {"project": options.get("project"),
                  "emulator_host": options.get("emulator_host"),
                  "tls_ca_file": options.get("tls_ca_file"),
                  "conn_id": options.get("conn_id")}
        found = resolve_inline(inline, pubsub_settings_from_connection)
        if not found.get("project") and not options["topic"].startswith("projects/"):
            raise PubSubConfigError("sending to Pub/Sub needs --project (or a connection "
                                    "giving one, or a full projects/P/topics/T path)")
        return cls(project=found.get("project") or "", topic=options["topic"],
                   emulator_host=found.get("emulator_host"),
                   tls_ca_file=found.get("tls_ca_file"))

    @property
    def destination(self) -> str:
        """``pubsub topic projects/<project>/topics/<topic>``."""
        return f"pubsub topic {self.path}"

    def _address(self) -> str:
        return self.host or "pubsub.googleapis.com"

    def _error(self, what: str, exc: Exception) -> Exception:
        exceptions = _sdk("google.api_core.exceptions")
        if isinstance(exc, exceptions.NotFound):
            return PubSubConfigError(f"no topic {self.path} on Pub/Sub at {self._address()}")
        if isinstance(exc, exceptions.ServiceUnavailable) and "handshake" in str(exc).lower():
            return SendConnectError(  # gRPC's text is pages of OpenSSL detail
                f"the TLS handshake with Pub/Sub at {self._address()} failed: certificate "
                f"verify failed against tls_ca_file {self.tls_ca_file}")
        if isinstance(exc, exceptions.ServiceUnavailable | exceptions.DeadlineExceeded):
            return SendConnectError(f"cannot reach Pub/Sub at {self._address()} "
                                    f"({type(exc).__name__})")
        return SendFailed(f"{what} {self.path} failed: {exc}")

    async def open(self) -> None:
        """Make the publisher client and check that the topic exists."""
        exceptions = _sdk("google.api_core.exceptions")
        self.client = pubsub_clients(self.host, "publisher", ca_file=self.tls_ca_file)
        try:
            await self.client.get_topic(topic=self.path, retry=None, timeout=_TIMEOUT)
        except exceptions.GoogleAPICallError as exc:
            raise self._error("reading topic", exc) from exc

    async def send(self, batch: Sequence[OutgoingMessage]) -> None:
        """Publish ``batch`` in one request (its messages keep their order per ordering key)."""
        types = _sdk("google.pubsub_v1.types")
        exceptions = _sdk("google.api_core.exceptions")
        messages = [types.PubsubMessage(data=message.body, attributes=dict(message.properties),
                                        ordering_key=message.key or "")
                    for message in batch]
        try:
            await self.client.publish(topic=self.path, messages=messages, timeout=_TIMEOUT)
        except exceptions.GoogleAPICallError as exc:
            raise self._error("publishing to", exc) from exc

    async def close(self) -> None:
        """Close the client's channel; idempotent."""
        client, self.client = self.client, None
        if client is not None:
            await client.transport.close()
