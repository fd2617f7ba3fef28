"""The ``webhook`` target: POST each DAG run, signed, to a URL that a connection names.

Configured as ``[targets.NAME]`` with ``type = "webhook"`` and ``conn_id``,
the connection holding the receiver's address and the signing secret
(secrets never go in a target's table), and optionally ``path``, appended
to the connection's URL (a DAG may set its own in ``target_options``).

The URL (:func:`base_url`) is ``scheme://host:port/schema``, the
connection's ``schema`` being the path prefix. The scheme is the
connection's ``conn_type`` when that is ``http`` or ``https``; for any other
type it is ``extra["scheme"]``, else ``https``. Two Airflow habits win over
that: a host written with its protocol (``http://https://hooks.example``)
and a ``schema`` of exactly ``http`` or ``https`` (Airflow's HTTP
connections keep the scheme there) give the scheme. ``login`` is not used.

Each attempt is one ``POST`` of the run document (:meth:`RunDocument.to_json`
as compact JSON, keys sorted) with these headers:

* ``Idempotency-Key``: ``dag_id/run_id``, the same on every attempt;
* ``X-Sharedstream-Attempt``: the attempt number, from 1;
* ``X-Sharedstream-Timestamp``: when the attempt was sent, Unix seconds;
* ``X-Sharedstream-Signature``: ``sha256=`` and the hex HMAC-SHA256 of
  ``b"<timestamp>." + body``, keyed by the connection's ``password`` (UTF-8).
  Without a password deliveries are unsigned (a warning at open says so);
* ``traceparent``: the run's W3C trace context, when it has one.

A receiver checks a delivery with :func:`verify_signature`: the signature
must match the timestamp and the exact bytes received (not re-serialized
JSON), and the timestamp must be within ``tolerance`` seconds of its own
clock, so a captured request cannot be replayed later. It then looks up
the ``Idempotency-Key``: a key it already has is a repeat.

Answers: any ``2xx`` is ``dispatched`` (a JSON object's ``id`` or ``run_id``
is kept as the run's external id, its ``url`` as the external URL);
``409`` is ``dispatched`` too (the receiver already has that key); the rest
mean what :func:`~sharedstream.dispatch._http.refusal` says (``5xx``,
``408``, ``429``, no answer: retried; other ``4xx``: undeliverable).

Guarantee: at least once; effectively once for a receiver that keeps the
keys it accepted. A webhook cannot be asked later what became of a run
(:attr:`WebhookTarget.follows` is false): ``sharedstream runs mark``
records what the receiver reports.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from sharedstream.connections import Connection, is_ipv6
from sharedstream.dispatch._http import HttpAnswer, HttpClient, refusal
from sharedstream.dispatch.document import RunDocument
from sharedstream.dispatch.target import (
    Delivery,
    Target,
    TargetConfigError,
    TargetContext,
    TargetError,
    TargetOption,
)
from sharedstream.engine.errors import SharedStreamError
from sharedstream.engine.keyvalue_log import key_value_logger

__all__ = ["SIGNATURE_PREFIX", "WebhookTarget", "base_url", "sign", "verify_signature"]

log = key_value_logger("sharedstream.dispatch.webhook")

SIGNATURE_PREFIX = "sha256="
"""What ``X-Sharedstream-Signature`` starts with, before the hex digest."""

_SCHEMES = ("http", "https")


def sign(secret: str | bytes, timestamp: int | str, body: bytes) -> str:
    """The ``X-Sharedstream-Signature`` value of ``body`` sent at ``timestamp``."""
    key = secret.encode() if isinstance(secret, str) else secret
    digest = hmac.new(key, f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    return SIGNATURE_PREFIX + digest


def verify_signature(secret: str | bytes, timestamp: str | int, body: bytes, signature: str,
                     *, now: float | None = None, tolerance: float = 300) -> bool:
    """Whether a delivery is genuine and fresh; what a receiver calls first.

    ``timestamp`` and ``signature`` are the ``X-Sharedstream-Timestamp`` and
    ``X-Sharedstream-Signature`` headers as received, ``body`` the raw bytes.
    False when the timestamp is not an integer or is more than ``tolerance``
    seconds from ``now`` (default: this clock), or the signature does not
    match (compared in constant time). Never raises for bad input.
    """
    try:
        sent = int(timestamp)
    except (TypeError, ValueError):
        return False
    clock = time.time() if now is None else now
    if abs(clock - sent) > tolerance:
        return False
    return hmac.compare_digest(sign(secret, sent, body).encode(), signature.encode())


def base_url(connection: Connection) -> str:
    """``scheme://host[:port][/schema]`` of a connection (rules in the module docstring).

    Raises :class:`TargetConfigError` (one line naming the connection) when
    it has no host or names a scheme other than ``http`` or ``https``.
    """
    where = f"connection {connection.conn_id!r}"
    protocol, _, host = (connection.host or "").rpartition("://")
    if not host:
        raise TargetConfigError(f"{where} has no host: the webhook target needs the "
                                "receiver's address there")
    prefix = (connection.schema or "").strip("/")
    scheme = protocol.lower()
    if not scheme and prefix.lower() in _SCHEMES:
        scheme, prefix = prefix.lower(), ""
    if not scheme:
        scheme = connection.conn_type if connection.conn_type in _SCHEMES else str(
            connection.extra.get("scheme") or "https").lower()
    if scheme not in _SCHEMES:
        raise TargetConfigError(f"{where}: scheme {scheme!r} is not http or https")
    if is_ipv6(host):
        host = f"[{host}]"
    port = f":{connection.port}" if connection.port is not None else ""
    return f"{scheme}://{host}{port}" + (f"/{prefix}" if prefix else "")


class WebhookTarget(Target):
    """POSTs DAG runs to a receiver (see the module docstring).

    :meth:`open` finds the connection and starts one HTTP session;
    :meth:`deliver` may run ``max_concurrency`` times at once on it.
    """

    options: ClassVar[Mapping[str, TargetOption]] = {
        "conn_id": TargetOption(
            "str", None, "The connection holding the receiver's URL (host, port, schema as "
            "the path) and, as its password, the signing secret.", required=True),
        "path": TargetOption(
            "str", "", "Appended to the connection's URL (\"/orders\").", per_dag=True),
    }
    default_concurrency = 8
    default_timeout = 30.0
    follows = False

    def __init__(self, name: str, settings: Mapping[str, Any], context: TargetContext) -> None:
        super().__init__(name, settings, context)
        self._client: HttpClient | None = None
        self._secret: bytes | None = None

    @property
    def url(self) -> str | None:
        """Where deliveries go, once :meth:`open` found the connection."""
        return None if self._client is None else self._client.base + self._path

    @property
    def _path(self) -> str:
        path = str(self.settings.get("path") or "")
        return "/" + path.lstrip("/") if path else ""

    async def open(self) -> None:
        """Find the connection and start the session; :class:`TargetConfigError` if unusable.

        A missing ``conn_id``, a connection that is missing or malformed, or
        one without a host each raise one line naming it. Called once.
        """
        where = f"target {self.name!r}"
        conn_id = self.settings.get("conn_id")
        if not conn_id:
            raise TargetConfigError(f"{where}: conn_id is required (the connection holding the "
                                    "receiver's URL and signing secret)")
        try:
            connection = self.context.connection(conn_id)
        except SharedStreamError as exc:  # ConnectionNotFound, InvalidConnection
            raise TargetConfigError(f"{where}: {exc}") from exc
        base = base_url(connection)
        self._secret = connection.password.encode() if connection.password else None
        if self._secret is None:
            log.warning("webhook deliveries are not signed: the connection has no password",
                        target=self.name, conn_id=conn_id)
        client = HttpClient("webhook", base, self.timeout)
        await client.open()
        self._client = client

    async def aclose(self) -> None:
        """Close the session; idempotent."""
        client, self._client = self._client, None
        if client is not None:
            await client.close()

    def _headers(self, run: RunDocument, body: bytes, timestamp: int) -> dict[str, str]:
        """The headers of one attempt to deliver ``run`` as ``body`` (module docstring)."""
        found = {"Content-Type": "application/json",
                 "Idempotency-Key": run.idempotency_key,
                 "X-Sharedstream-Attempt": str(run.attempt),
                 "X-Sharedstream-Timestamp": str(timestamp)}
        if self._secret is not None:
            found["X-Sharedstream-Signature"] = sign(self._secret, timestamp, body)
        if run.trace_parent:
            found["traceparent"] = run.trace_parent
        return found

    async def deliver(self, run: RunDocument, progress: Callable[[str], None]) -> Delivery:
        """POST ``run`` once; ``dispatched`` on ``2xx`` or ``409``, else :class:`TargetError`.

        Safe to call concurrently. Never calls ``progress``: a webhook only
        receives the run.
        """
        if self._client is None:
            raise TargetError(f"the webhook target {self.name!r} is not open", retryable=True)
        body = json.dumps(run.to_json(), separators=(",", ":"), sort_keys=True).encode()
        headers = self._headers(run, body, int(time.time()))
        answer = await self._client.request("POST", self._path, data=body, headers=headers)
        if answer.status == 409:
            return Delivery("dispatched", detail="HTTP 409: already delivered")
        if not answer.ok:
            raise refusal(answer, f"POST {self.url}")
        return _accepted(answer)


def _accepted(answer: HttpAnswer) -> Delivery:
    """A ``2xx`` as a delivery: the receiver's name and URL of the run when it gave them."""
    said = answer.document if isinstance(answer.document, Mapping) else {}
    external_id = None
    for key in ("id", "run_id"):
        value = said.get(key)
        if isinstance(value, str | int) and not isinstance(value, bool):
            external_id = str(value)
            break
    url = said.get("url")
    return Delivery("dispatched", detail=f"HTTP {answer.status}", external_id=external_id,
                    external_url=url if isinstance(url, str) else None)
