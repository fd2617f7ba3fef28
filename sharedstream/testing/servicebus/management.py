"""The ``<entity>/$management`` node of the Service Bus test server: requests in, answers out.

Each request is an AMQP message whose ``operation`` application property
names what to do and whose body is a map; the answer carries
``statusCode`` and ``statusDescription`` (and ``errorCondition`` on a
failure, which the SDK maps to its exception) and a map body. The service
(:mod:`.service`) sends the answer on the node's response link with the
request's message id as correlation id.

Operations answered: ``com.microsoft:renew-lock`` (any number of lock
tokens in one request, answered with an ``expirations`` array, one per
token in order, or, when one of them is no longer locked or belongs to
another entity, 410 ``message-lock-lost`` for the whole request with
nothing renewed), ``com.microsoft:renew-session-lock``, ``com.microsoft:peek-message``,
``com.microsoft:update-disposition``, ``com.microsoft:get-session-state``,
``com.microsoft:set-session-state``,
``com.microsoft:receive-by-sequence-number`` (deferred messages only, locked
with their lock tokens in the answer, or removed when
``receiver-settle-mode`` is 0, receive-and-delete; a number naming no
deferred message fails the whole request with 404
``com.microsoft:message-not-found``),
``com.microsoft:schedule-message`` (each encoded message sent as by a
sender, at its ``x-opt-scheduled-enqueue-time``; answered with their
``sequence-numbers``), ``com.microsoft:cancel-scheduled-message`` (404
``message-not-found`` for a number naming no message still waiting) and
``com.microsoft:get-message-sessions`` (``last-updated-time`` at .NET's
``DateTime.MaxValue`` lists the sessions with messages or a state, an
earlier time those whose state was set since; ``skip`` and ``top`` page;
204 when none is left). The management node of a topic answers the two
scheduling operations. Any other operation gets 501 with
``amqp:not-implemented``: the test server does not manage rules.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from proton import UNDESCRIBED, Array, Data, Message, symbol, timestamp

from sharedstream.testing.servicebus import wire
from sharedstream.testing.servicebus.model import (
    ARGUMENT_ERROR,
    MESSAGE_LOCK_LOST,
    MESSAGE_NOT_FOUND,
    NOT_FOUND,
    SESSION_CANNOT_BE_LOCKED,
    SESSION_LOCK_LOST,
    Outcome,
    Refused,
)
from sharedstream.testing.servicebus.state import ServiceBusState

__all__ = ["Management"]

_STATUS = {NOT_FOUND: 404, MESSAGE_NOT_FOUND: 404, MESSAGE_LOCK_LOST: 410,
           SESSION_LOCK_LOST: 410, SESSION_CANNOT_BE_LOCKED: 409}
_DISPOSITIONS = {"completed": Outcome.COMPLETE, "abandoned": Outcome.ABANDON,
                 "defered": Outcome.DEFER, "suspended": Outcome.DEAD_LETTER}
RECEIVE_AND_DELETE = 0
"""``receiver-settle-mode`` of a receive-and-delete receiver (AMQP's ``first``)."""
LIST_EVERY_SESSION_MS = 253402300800000
"""``last-updated-time`` meaning no filter: .NET's ``DateTime.MaxValue`` as the SDKs send it."""


def _ms(seconds: float) -> timestamp:
    return timestamp(int(seconds * 1000))


def _text(value: object) -> str | None:
    if value is None:
        return None
    return value.decode() if isinstance(value, bytes) else str(value)


class Management:
    """Answers management requests against one :class:`~.state.ServiceBusState`.

    ``keep`` is called once messages were scheduled, before the answer goes
    out (the service writes its state file there, as for a send).
    """

    def __init__(self, state: ServiceBusState, keep: Callable[[], None] = lambda: None) -> None:
        self.state, self.keep = state, keep
        self._operations: dict[str, Callable[[str, Mapping[str, Any]], tuple[int, Any]]] = {
            "com.microsoft:renew-lock": self._renew_lock,
            "com.microsoft:renew-session-lock": self._renew_session_lock,
            "com.microsoft:peek-message": self._peek,
            "com.microsoft:update-disposition": self._update_disposition,
            "com.microsoft:get-session-state": self._get_session_state,
            "com.microsoft:set-session-state": self._set_session_state,
            "com.microsoft:receive-by-sequence-number": self._receive_by_sequence_number,
            "com.microsoft:schedule-message": self._schedule,
            "com.microsoft:cancel-scheduled-message": self._cancel_scheduled,
            "com.microsoft:get-message-sessions": self._get_message_sessions,
        }

    def answer(self, path: str, request: Message) -> Message:
        """The response to ``request`` made of the node of store ``path``; never raises Refused.

        A refusal of the state becomes a failure status with its condition.
        The caller sets the correlation id.
        """
        properties: dict[str, Any] = dict(request.properties or {})
        operation = str(properties.get("operation", ""))
        body = request.body if isinstance(request.body, dict) else {}
        handler = self._operations.get(operation)
        if handler is None:
            return _response(501, f"{operation!r} is not implemented by the test server",
                             condition="amqp:not-implemented")
        try:
            status, value = handler(path, body)
        except Refused as refused:
            return _response(_STATUS.get(refused.condition, 400), refused.description,
                             condition=refused.condition)
        return _response(status, "OK" if status == 200 else "No Content", value)

    def _renew_lock(self, path: str, body: Mapping[str, Any]) -> tuple[int, Any]:
        """Renew every listed lock or none: one stale token fails the request with 410."""
        self.state.check_store(path)
        tokens = wire.lock_tokens(body.get("lock-tokens"))
        if not tokens:
            raise Refused(ARGUMENT_ERROR, "lock-tokens must list at least one lock token")
        ends = self.state.renew_locks(tokens, path)
        # An AMQP array of timestamps, as Service Bus answers (not a list); proton's stub
        # types the descriptor as data and misses its own UNDESCRIBED constant.
        expirations = Array(UNDESCRIBED, Data.TIMESTAMP, *map(_ms, ends))  # type: ignore[arg-type]
        return 200, {"expirations": expirations}

    def _renew_session_lock(self, path: str, body: Mapping[str, Any]) -> tuple[int, Any]:
        receiver = self.state.session_receiver(path, _text(body.get("session-id")) or "")
        return 200, {"expiration": _ms(self.state.renew_session_lock(receiver))}

    def _peek(self, path: str, body: Mapping[str, Any]) -> tuple[int, Any]:
        peeked = self.state.peek(path, int(body.get("from-sequence-number") or 0),
                                 int(body.get("message-count") or 1),
                                 _text(body.get("session-id")))
        if not peeked:
            return 204, {}
        return 200, {"messages": [{"message": wire.delivery_bytes(d)} for d in peeked]}

    def _update_disposition(self, path: str, body: Mapping[str, Any]) -> tuple[int, Any]:
        self.state.check_store(path)
        outcome = _DISPOSITIONS.get(_text(body.get("disposition-status")) or "")
        if outcome is None:
            raise Refused("com.microsoft:argument-error", "unknown disposition-status")
        for token in wire.lock_tokens(body.get("lock-tokens")):
            self.state.settle(token, outcome, reason=_text(body.get("deadletter-reason")),
                              description=_text(body.get("deadletter-description")))
        return 200, {}

    def _get_session_state(self, path: str, body: Mapping[str, Any]) -> tuple[int, Any]:
        session = _text(body.get("session-id")) or ""
        self.state.session_receiver(path, session)
        return 200, {"session-id": session,
                     "session-state": self.state.session_state(path, session)}

    def _set_session_state(self, path: str, body: Mapping[str, Any]) -> tuple[int, Any]:
        session = _text(body.get("session-id")) or ""
        self.state.session_receiver(path, session)
        value = body.get("session-state")
        self.state.set_session_state(path, session, None if value is None else bytes(value))
        return 200, {}


    def _receive_by_sequence_number(self, path: str, body: Mapping[str, Any]) -> tuple[int, Any]:
        mode = body.get("receiver-settle-mode")
        deliveries = self.state.receive_deferred(
            path, wire.integers(body.get("sequence-numbers")),
            receive_and_delete=mode is not None and int(mode) == RECEIVE_AND_DELETE,
            session_id=_text(body.get("session-id")))
        messages = [{"message": wire.delivery_bytes(delivery)}
                    | ({} if delivery.lock_token is None else {"lock-token": delivery.lock_token})
                    for delivery in deliveries]
        return 200, {"messages": messages}

    def _schedule(self, path: str, body: Mapping[str, Any]) -> tuple[int, Any]:
        items = body.get("messages")
        if not isinstance(items, list) or not items:
            raise Refused(ARGUMENT_ERROR, "messages must list at least one message")
        try:
            messages = [wire.message_facts(bytes(item["message"])) for item in items]
        except (KeyError, TypeError) as exc:
            raise Refused(ARGUMENT_ERROR, f"a scheduled message is malformed: {exc}") from exc
        numbers = self.state.send(path, messages)
        self.keep()
        return 200, {"sequence-numbers": Array(UNDESCRIBED, Data.LONG,  # type: ignore[arg-type]
                                               *numbers)}

    def _cancel_scheduled(self, path: str, body: Mapping[str, Any]) -> tuple[int, Any]:
        self.state.cancel_scheduled(path, wire.integers(body.get("sequence-numbers")))
        return 200, {}

    def _get_message_sessions(self, path: str, body: Mapping[str, Any]) -> tuple[int, Any]:
        since = body.get("last-updated-time")
        skip = int(body.get("skip") or 0)
        sessions = self.state.list_sessions(
            path, updated_after=None if since is None or int(since) >= LIST_EVERY_SESSION_MS
            else int(since) / 1000, skip=skip, top=int(body.get("top") or 100))
        if not sessions:
            return 204, {}
        return 200, {"skip": skip + len(sessions),
                     "sessions-ids": Array(UNDESCRIBED, Data.STRING,  # type: ignore[arg-type]
                                           *sessions)}


def _response(status: int, description: str, body: Any = None, *,
              condition: str | None = None) -> Message:
    properties: dict[str, object] = {"statusCode": status, "statusDescription": description}
    if condition is not None:
        properties["errorCondition"] = symbol(condition)
    return Message(body=body if body is not None else {}, properties=properties)
