"""What Pub/Sub refuses: malformed resource names and messages past its limits - no I/O.

The test server refuses what Pub/Sub refuses, with Pub/Sub's status and,
where Google's documentation or its users' reports give it, Pub/Sub's text
(the rest in the same style): a caller checks with :func:`check_name` and
:func:`check_messages` and lets the :class:`Refused` they raise become the
call's gRPC status. Pure functions of their arguments; nothing here knows
the server's state or the wire.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

__all__ = [
    "MAX_ATTRIBUTES",
    "MAX_ATTRIBUTE_KEY_BYTES",
    "MAX_ATTRIBUTE_VALUE_BYTES",
    "MAX_MESSAGES_PER_PUBLISH",
    "MAX_ORDERING_KEY_BYTES",
    "Refused",
    "check_messages",
    "check_name",
    "project_of",
]

MAX_MESSAGES_PER_PUBLISH = 1000
MAX_ATTRIBUTES = 100
"""Attributes per message."""
MAX_ATTRIBUTE_KEY_BYTES = 256
MAX_ATTRIBUTE_VALUE_BYTES = 1024
MAX_ORDERING_KEY_BYTES = 1024
_QUOTAS = "Refer to https://cloud.google.com/pubsub/quotas for more information."
_CLIENT_KEYS = frozenset({"googclient_traceparent", "googclient_tracestate",
                          "googclient_baggage"})
"""The ``goog``-prefixed attribute keys Google's client libraries themselves publish (the
OpenTelemetry context, ``googclient_`` + the propagator's key): Pub/Sub takes these."""

_NAME = re.compile(
    r"projects/[^/]+/(?P<kind>topics|subscriptions)/(?!goog)[A-Za-z][-A-Za-z0-9_.~+%]{2,254}")
"""Pub/Sub's resource names: an id starts with a letter, has 3 to 255 of letters, digits and
``-_.~+%`` (ASCII), and does not start with ``goog``. The project part is not checked."""


class Refused(Exception):
    """The server refuses a request; ``status`` is the gRPC status code's name.

    ``NOT_FOUND``, ``ALREADY_EXISTS``, ``INVALID_ARGUMENT`` or
    ``UNIMPLEMENTED`` (or any status a test hook ends a stream with); the
    service aborts the call with it and the message.
    """

    def __init__(self, status: str, message: str) -> None:
        super().__init__(message)
        self.status = status


def check_name(name: str, kind: str, field: str = "name") -> str:
    """``name`` if it is a valid ``projects/<p>/<kind>/<id>``; else ``INVALID_ARGUMENT``.

    ``field`` is the request field that named it, for the refusal's text
    (which is Pub/Sub's).
    """
    match = _NAME.fullmatch(name)
    if match is None or match["kind"] != kind:
        raise Refused("INVALID_ARGUMENT", f"Invalid resource name given ({field}={name}). Refer "
                      "to https://cloud.google.com/pubsub/docs/admin#resource_names for more "
                      "information.")
    return name


def check_messages(messages: Sequence[tuple[bytes, Mapping[str, str], str]]) -> None:
    """Refuse (``INVALID_ARGUMENT``) ``(data, attributes, ordering key)`` messages Pub/Sub refuses.

    A refusal is of the whole publish request: nothing of it is published.

    Pub/Sub's resource limits: at most :data:`MAX_MESSAGES_PER_PUBLISH` messages
    a request; each message has data or attributes, at most
    :data:`MAX_ATTRIBUTES` attributes, keys of at most
    :data:`MAX_ATTRIBUTE_KEY_BYTES` bytes that do not start with ``goog``
    (reserved, but for :data:`_CLIENT_KEYS`), values of at most
    :data:`MAX_ATTRIBUTE_VALUE_BYTES` bytes, and an ordering key of at most
    :data:`MAX_ORDERING_KEY_BYTES` bytes. Sizes are UTF-8 bytes (Pub/Sub's
    texts say "characters" but count bytes). The request's size is the
    service's to check (it is a matter of the wire).
    """
    if not messages:
        raise Refused("INVALID_ARGUMENT", "a publish request needs at least one message")
    if len(messages) > MAX_MESSAGES_PER_PUBLISH:
        raise Refused("INVALID_ARGUMENT", f"The value for message_count is too large. You "
                      f"passed {len(messages)} in the request, but the maximum value is "
                      f"{MAX_MESSAGES_PER_PUBLISH}.")
    for data, attributes, ordering_key in messages:
        if not data and not attributes:
            raise Refused("INVALID_ARGUMENT", "a message needs data or attributes")
        if len(attributes) > MAX_ATTRIBUTES:
            raise Refused("INVALID_ARGUMENT", f"The value for attribute_count is too large. "
                          f"You passed {len(attributes)} in the request, but the maximum "
                          f"value is {MAX_ATTRIBUTES}. {_QUOTAS}")
        for key, value in attributes.items():
            _check_attribute(key, value)
        size = len(ordering_key.encode())
        if size > MAX_ORDERING_KEY_BYTES:
            raise Refused("INVALID_ARGUMENT", f"The ordering key in the request is too long. "
                          f"The length is {size} characters, but the maximum allowed is "
                          f"{MAX_ORDERING_KEY_BYTES}. {_QUOTAS}")


def _check_attribute(key: str, value: str) -> None:
    if key.startswith("goog") and key not in _CLIENT_KEYS:
        raise Refused("INVALID_ARGUMENT",
                      f"The request contains an attribute key that is not valid (key={key}).")
    for part, text, limit in (("key", key, MAX_ATTRIBUTE_KEY_BYTES),
                              ("value", value, MAX_ATTRIBUTE_VALUE_BYTES)):
        size = len(text.encode())
        if size > limit:
            raise Refused("INVALID_ARGUMENT", f'The attribute "{key[:64]}" in the request has a '
                          f"{part} that is too long. The length is {size} characters, but the "
                          f"maximum allowed is {limit}. {_QUOTAS}")


def project_of(name: str) -> str:
    """``projects/<p>`` of a resource name."""
    return "/".join(name.split("/", 2)[:2])
