"""Pub/Sub: the SDK, loaded lazily, its async GAPIC clients, and one unary call.

Private to :mod:`sharedstream.producers.pubsub`, which re-exports
:func:`pubsub_clients` (import it from there). google-cloud-pubsub is
imported only when a client is made or a call fails (:data:`SDK`): without
the ``pubsub`` extra, the producer's constructor says how to install it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

from sharedstream.brokerkit.calls import BrokerCalls
from sharedstream.brokerkit.retry import RetryPolicy, retrying
from sharedstream.brokerkit.sdk import OptionalSdk
from sharedstream.producers._pubsub_types import (
    CHANNEL_OPTIONS,
    PubSubConfigError,
    PubSubRequestError,
    sdk_error,
    transient,
)

__all__ = ["SDK", "pubsub_clients", "unary"]

_T = TypeVar("_T")

SDK = OptionalSdk(broker="Pub/Sub", package="google.pubsub_v1", extra="pubsub",
                  error=PubSubConfigError)
"""google-cloud-pubsub, imported on first use; a missing extra is a :class:`PubSubConfigError`."""


def pubsub_clients(host: str | None, kind: str, *, ca_file: str | None = None) -> Any:
    """A new async GAPIC client, ``kind`` ``"publisher"`` or ``"subscriber"``. No I/O yet.

    With an emulator ``host`` (``host:port``) the transport is a channel to
    it without credentials and without gRPC's message size limits
    (:data:`CHANNEL_OPTIONS`), as the SDK's own clients do: plain text, or
    TLS verified against the PEM ``ca_file`` when given; otherwise the
    default transport with Application Default Credentials. Raises
    :class:`PubSubConfigError` for a ``ca_file`` without a host or that
    cannot be read. The caller closes it (``client.transport.close()``).
    Used by the producer, ``sharedstream send`` and ``sharedstream broker start``.
    """
    module = SDK(f"google.pubsub_v1.services.{kind}")
    client_class = getattr(module, f"{kind.capitalize()}AsyncClient")
    if not host:
        if ca_file is not None:
            raise PubSubConfigError("tls_ca_file needs an emulator host (emulator_host or "
                                    "PUBSUB_EMULATOR_HOST); Google's endpoint uses the system's "
                                    "certificate authorities")
        return client_class()
    transport = getattr(module.transports, f"{kind.capitalize()}GrpcAsyncIOTransport")
    grpc = SDK("grpc")
    if ca_file is None:
        channel = grpc.aio.insecure_channel(host, options=CHANNEL_OPTIONS)
    else:
        try:
            trusted = Path(ca_file).read_bytes()
        except OSError as exc:
            raise PubSubConfigError(
                f"tls_ca_file {ca_file!r} cannot be read: {exc.strerror or exc}") from exc
        channel = grpc.aio.secure_channel(host, grpc.ssl_channel_credentials(trusted),
                                          options=CHANNEL_OPTIONS)
    return client_class(transport=transport(channel=channel))


async def unary(operation: str, call: Callable[[], Awaitable[_T]], *, calls: BrokerCalls,
                policy: RetryPolicy, subscription: str) -> _T:
    """``call()`` once per attempt, each counted in ``calls`` as ``operation``.

    An error that may pass is retried per ``policy``; past the last attempt
    it is raised as :class:`PubSubRequestError`. One that cannot pass (no
    such subscription or topic, no permission) is raised at once, as
    :func:`sdk_error` maps it (a :class:`PubSubConfigError`, mostly), its
    cause the SDK's error. A cancellation is raised as is.
    """
    exceptions = SDK("google.api_core.exceptions")

    async def attempt() -> _T:
        calls.count(operation)
        return await call()

    try:
        return await retrying(operation, attempt, policy=policy,
                              catch=exceptions.GoogleAPICallError, transient=transient,
                              wrap=PubSubRequestError)
    except PubSubRequestError as exc:
        cause = exc.__cause__
        if isinstance(cause, exceptions.GoogleAPICallError) and not transient(cause):
            raise sdk_error(f"{operation} on {subscription}", cause, exceptions) from cause
        raise
