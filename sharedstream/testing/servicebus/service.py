"""The Service Bus test server's AMQP side: links, CBS, settlement and flow over the state.

A proton :class:`~proton.Handler` for a :class:`~proton.reactor.Container`
that listens. Every event runs on the container's one thread, as does every
call into :class:`~.state.ServiceBusState`.

What a client's link means, by its address (``amqps://host/`` prefixes are
dropped; paths are the state's):

* receiving from ``$cbs`` / sending to ``$cbs``: the CBS request/response
  pair. A ``put-token`` is answered 200 when :func:`~.auth.verify` accepts
  its shared access signature against the namespace's keys (the grant is
  kept for the connection), else 401 with the reason; an audience naming
  an entity that does not exist is answered 404 (as Service Bus answers:
  a missing entity is found at ``put-token``, before any attach). The SDK
  raises both as ``ServiceBusAuthenticationError``. Every other link needs a live grant
  covering its entity (:func:`~.auth.authorize`): ``Listen`` to receive,
  ``Send`` to send, either for the management node; without it the attach
  is refused with ``amqp:unauthorized-access``;
* ``<path>/$management``: the management node of a store or a topic (the
  operations :mod:`.management` lists; anything else is answered 501);
* sending to ``<queue or topic>``: the link advertises the namespace's
  ``max-message-size``; each transfer (or each message of a batch,
  :func:`~.wire.unpack`) is enqueued, then the delivery is accepted; a
  larger transfer is rejected with ``amqp:link:message-size-exceeded``, a
  refusal of the state with the state's condition (every rejection's error
  carries an ``info`` map, as the SDK expects);
* receiving from ``<store>``: a receiver (:meth:`~.state.ServiceBusState.open_receiver`),
  with the session of the ``com.microsoft:session-filter`` source filter
  (a string; any other value is refused with ``amqp:invalid-field``).
  A ``next available session`` attach with no session free is answered
  when one becomes free, or refused with ``com.microsoft:timeout`` after the
  link's ``com.microsoft:timeout`` (when not given, the namespace's
  ``next_session_wait``: 65 s unless configured, as Service Bus).

Guarantees: a delivery goes out only against the link's credit (prefetch is
the SDK's credit), its 16-byte tag is the lock token's ``bytes_le`` (empty
for a settled, receive-and-delete delivery, as Service Bus sends it); an
unsettled disposition from the client is applied, then echoed settled with
the same outcome (``rejected`` without an error), or settled ``rejected``
with ``message-lock-lost`` when the lock had ended. A drain request is
answered once nothing more can be sent. An unknown entity is refused at
attach with ``amqp:not-found`` (reached only under a namespace-wide
audience, or when the entity went away after its token was put: the SDK
puts each token for its entity, refused first at ``put-token``). With a
:class:`~.state_file.StateFile`, a send is written before it is
accepted and every other event that may have changed the state is
written within the file's debounce (its invariants).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from cproton import ffi, lib  # type: ignore[import-untyped]  # proton's C binding
from proton import Condition, Delivery, Endpoint, Event, Handler, Link, Message, Terminus, symbol
from proton import Receiver as ProtonReceiver
from proton import Sender as ProtonSender

from sharedstream.engine.keyvalue_log import key_value_logger
from sharedstream.testing.servicebus import auth, wire
from sharedstream.testing.servicebus.management import Management
from sharedstream.testing.servicebus.model import (
    MESSAGE_SIZE_EXCEEDED,
    NEXT_SESSION,
    NOT_FOUND,
    Namespace,
    NextSession,
    Outcome,
    Refused,
    Right,
)
from sharedstream.testing.servicebus.state import Receiver, ServiceBusState
from sharedstream.testing.servicebus.state_file import StateFile

__all__ = ["ServiceBusService"]

_LOG = key_value_logger(__name__)
CBS = "$cbs"
MANAGEMENT = "/$management"
SESSION_FILTER = symbol("com.microsoft:session-filter")
SESSION_LOCKED_UNTIL = symbol("com.microsoft:locked-until-utc")
LINK_TIMEOUT = symbol("com.microsoft:timeout")
TIMEOUT = "com.microsoft:timeout"
INVALID_FIELD = "amqp:invalid-field"
DOTNET_EPOCH_TICKS = 621355968000000000
"""``DateTime`` ticks (100 ns since year 1) at the Unix epoch: the session lock's unit."""
CREDIT = 200


def entity_path(address: str | None) -> str:
    """The state path of a link address: ``amqps://host/q`` and ``q`` both give ``q``."""
    address = address or ""
    if "://" in address:
        address = urlsplit(address).path
    return address.strip("/")


def raw_tag(delivery: Delivery) -> bytes:
    """The delivery tag's bytes (proton's ``Delivery.tag`` decodes them as UTF-8)."""
    tag = lib.pn_delivery_tag(delivery._impl)  # proton keeps the raw tag there
    return bytes(ffi.unpack(tag.start, tag.size))


@dataclass(eq=False)
class _Waiting:
    """A session receive link waiting for a session to become free."""

    link: ProtonSender
    path: str
    receive_and_delete: bool
    deadline: float
    seconds: float
    """How long it waits in all (what the refusal quotes)."""


def _hms(seconds: float) -> str:
    """``seconds`` as Service Bus quotes a timeout: ``00:01:05``."""
    whole = round(seconds)
    return f"{whole // 3600:02d}:{whole // 60 % 60:02d}:{whole % 60:02d}"


@dataclass(eq=False)
class _Connection:
    """What one client connection holds: its receivers and its reply links by address."""

    receivers: dict[ProtonSender, Receiver] = field(default_factory=dict)
    replies: dict[str, ProtonSender] = field(default_factory=dict)
    grants: list[auth.Grant] = field(default_factory=list)


def _condition(name: str, description: str) -> Condition:
    """An error as Service Bus sends it: with an ``info`` map (the SDK reads its third field)."""
    return Condition(name, description, {symbol("com.microsoft:tracking-id"): str(uuid.uuid4())})


class ServiceBusService(Handler):
    """The server's event handler (see the module's docstring).

    ``clock`` must be the state's monotonic clock (attach waits use it).
    ``state_file``: where the state is kept across restarts (``None``: in
    memory only); :meth:`tick` writes what is due, the server writes the
    rest when it stops. ``namespace``: the keys tokens are checked against
    and the message size limit.
    """

    def __init__(self, state: ServiceBusState, clock: Callable[[], float],
                 state_file: StateFile | None = None, namespace: Namespace | None = None) -> None:
        super().__init__()
        self.state, self.clock, self.state_file = state, clock, state_file
        self.namespace = namespace or Namespace()
        self.management = Management(state, keep=self._keep)
        self._connections: dict[Any, _Connection] = {}
        self._waiting: list[_Waiting] = []
        self._stale_paths: set[str] = set()
        state.on_available = self._stale_paths.add

    # -- connections and sessions -------------------------------------------------

    def on_connection_bound(self, event: Event) -> None:  # noqa: D102 - proton's events
        if event.transport is None:
            return
        sasl = event.transport.sasl()
        sasl.allowed_mechs("ANONYMOUS PLAIN")
        sasl.allow_insecure_mechs = True

    def on_connection_remote_open(self, event: Event) -> None:  # noqa: D102
        connection = event.connection
        if connection is None:
            return
        self._connections[connection] = _Connection()
        connection.container = "sharedstream-servicebus-test-server"
        connection.open()

    def on_session_remote_open(self, event: Event) -> None:  # noqa: D102
        if event.session is not None:
            event.session.open()

    def on_session_remote_close(self, event: Event) -> None:  # noqa: D102
        if event.session is not None:
            event.session.close()

    def on_connection_remote_close(self, event: Event) -> None:  # noqa: D102
        if event.connection is not None:
            event.connection.close()
            self._forget(event.connection)

    def on_transport_closed(self, event: Event) -> None:  # noqa: D102
        if event.connection is not None:
            self._forget(event.connection)
            event.connection.free()

    def _forget(self, connection: Any) -> None:
        held = self._connections.pop(connection, None)
        if held is not None:
            for receiver in held.receivers.values():
                self.state.close_receiver(receiver)
            self._changed()
        self._waiting = [w for w in self._waiting if w.link.connection is not connection]
        self.settle_changes()

    # -- links ----------------------------------------------------------------------

    def on_link_remote_open(self, event: Event) -> None:  # noqa: D102
        link = event.link
        if link is None or not link.state & Endpoint.LOCAL_UNINIT:
            return
        link.source.copy(link.remote_source)
        link.target.copy(link.remote_target)
        link.snd_settle_mode = link.remote_snd_settle_mode
        link.rcv_settle_mode = link.remote_rcv_settle_mode
        try:
            if isinstance(link, ProtonReceiver):
                self._open_incoming(link)
            elif isinstance(link, ProtonSender):
                self._open_outgoing(link)
        except Refused as refused:
            self._refuse(link, refused.condition, refused.description)
        self.settle_changes()

    def _grants(self, link: Link) -> list[auth.Grant]:
        return self._connections.setdefault(link.connection, _Connection()).grants

    def _authorize(self, link: Link, path: str, right: Right) -> None:
        """``Refused`` unless the link's connection holds a token for ``path`` with ``right``.

        The management node (``right`` is then ``Listen``) takes ``Send`` too.
        """
        entity = path.removesuffix(MANAGEMENT)
        auth.authorize(self._grants(link), entity, right, self.state.wall(),
                       or_else=Right.SEND if entity != path else None)

    def _open_incoming(self, link: ProtonReceiver) -> None:
        address = link.remote_target.address or ""
        if address != CBS:
            path = entity_path(address)
            if path.endswith(MANAGEMENT):
                self._authorize(link, path, Right.LISTEN)
                self.state.check_entity(path.removesuffix(MANAGEMENT))
            else:
                self._authorize(link, path, Right.SEND)
                self.state.check_sendable(path)
                link.max_message_size = self.namespace.max_message_size
        link.open()
        link.flow(CREDIT)

    def _open_outgoing(self, link: ProtonSender) -> None:
        address = link.remote_source.address or ""
        path = entity_path(address)
        connection = self._connections.setdefault(link.connection, _Connection())
        if address == CBS or path.endswith(MANAGEMENT):
            if path.endswith(MANAGEMENT):
                self._authorize(link, path, Right.LISTEN)
                self.state.check_entity(path.removesuffix(MANAGEMENT))
            connection.replies[address] = link
            link.open()
            return
        self._authorize(link, path, Right.LISTEN)
        session = self._session_filter(link)
        receive_and_delete = link.remote_snd_settle_mode == Link.SND_SETTLED
        receiver = self.state.open_receiver(path, receive_and_delete=receive_and_delete,
                                            session=session)
        if receiver is None:
            properties = link.remote_properties or {}
            wait = properties.get(LINK_TIMEOUT)
            seconds = self.namespace.next_session_wait if wait is None else int(wait) / 1000
            self._waiting.append(_Waiting(link, path, receive_and_delete, self.clock() + seconds,
                                          seconds))
            return
        self._attach_receiver(link, receiver)

    @staticmethod
    def _session_filter(link: ProtonSender) -> str | NextSession | None:
        """The session a receiving link asks for, from its ``com.microsoft:session-filter``.

        ``None`` without the filter, ``NEXT_SESSION`` for a null one;
        ``Refused`` (``amqp:invalid-field``) for one that is no string, as the
        SDK's own tests expect of Service Bus (``session_id=1`` raises).
        """
        raw = link.remote_source.filter
        raw.rewind()
        filters = raw.get_object() if raw.next() is not None else None
        if not isinstance(filters, dict) or SESSION_FILTER not in filters:
            return None
        value = filters[SESSION_FILTER]
        value = getattr(value, "value", value)  # a described filter value
        if value is None:
            return NEXT_SESSION
        if not isinstance(value, str | bytes):
            raise Refused(INVALID_FIELD, f"The session id must be a string, not the "
                                         f"{type(value).__name__} {value!r}.")
        return value.decode() if isinstance(value, bytes) else str(value)

    def _attach_receiver(self, link: ProtonSender, receiver: Receiver) -> None:
        if receiver.session_id is not None:
            link.source.filter.clear()
            link.source.filter.put_object({SESSION_FILTER: receiver.session_id})
            ticks = int(self.state.session_locked_until(receiver) * 10_000_000)
            link.properties = {SESSION_LOCKED_UNTIL: ticks + DOTNET_EPOCH_TICKS}
        self._connections.setdefault(link.connection, _Connection()).receivers[link] = receiver
        link.open()
        self._pump(link, receiver)

    @staticmethod
    def _refuse(link: Link, condition: str, description: str) -> None:
        if link.state & Endpoint.LOCAL_UNINIT:
            # As Service Bus does: an attach without terminus, then the detach with the
            # error. The SDK then reports the error's condition (an attach that looked
            # accepted would make it send first and report a bare unknown-error).
            link.source.type = Terminus.UNSPECIFIED
            link.target.type = Terminus.UNSPECIFIED
            link.open()
        link.condition = _condition(condition, description)
        link.close()

    def on_link_remote_close(self, event: Event) -> None:  # noqa: D102
        link = event.link
        if link is None:
            return
        held = self._connections.get(link.connection)
        if held is not None:
            receiver = held.receivers.pop(link, None) if isinstance(link, ProtonSender) else None
            if receiver is not None:
                self.state.close_receiver(receiver)
                self._changed()
            held.replies = {k: v for k, v in held.replies.items() if v is not link}
        self._waiting = [w for w in self._waiting if w.link is not link]
        if not link.state & Endpoint.LOCAL_CLOSED:
            link.close()
        self.settle_changes()

    # -- sending to clients -------------------------------------------------------

    def on_link_flow(self, event: Event) -> None:  # noqa: D102
        link = event.link
        if not isinstance(link, ProtonSender):
            return
        held = self._connections.get(link.connection)
        receiver = None if held is None else held.receivers.get(link)
        if receiver is not None:
            self._pump(link, receiver)
        else:
            link.drained()

    def _pump(self, link: ProtonSender, receiver: Receiver) -> None:
        while link.credit > 0 and not receiver.closed:
            delivery = self.state.receive(receiver)
            if delivery is None:
                break
            # a settled delivery's tag is empty, as Service Bus's in receive-and-delete
            tag = b"" if delivery.lock_token is None else delivery.lock_token.bytes_le
            sent = link.delivery(tag)  # type: ignore[arg-type]  # it takes bytes too
            link.send(wire.delivery_bytes(delivery))
            link.advance()
            if delivery.lock_token is None:
                sent.settle()
        link.drained()

    def settle_changes(self) -> None:
        """Hand newly available messages to receivers and free sessions to waiting links.

        Called after every event that may have changed the state (and by
        the server's timer after :meth:`~.state.ServiceBusState.expire`).
        """
        while self._stale_paths:
            paths = {path.lower() for path in self._stale_paths}
            self._stale_paths.clear()
            for held in list(self._connections.values()):
                for link, receiver in list(held.receivers.items()):
                    if receiver.path.lower() in paths:
                        self._pump(link, receiver)
            for waiting in [w for w in self._waiting if w.path.lower() in paths]:
                self._retry_attach(waiting)

    def _retry_attach(self, waiting: _Waiting) -> None:
        try:
            receiver = self.state.open_receiver(waiting.path,
                                                receive_and_delete=waiting.receive_and_delete,
                                                session=NEXT_SESSION)
        except Refused as refused:
            self._waiting.remove(waiting)
            self._refuse(waiting.link, refused.condition, refused.description)
            return
        if receiver is not None:
            self._waiting.remove(waiting)
            self._attach_receiver(waiting.link, receiver)

    def tick(self) -> None:
        """Expire locks and attach waits that are due, write the state file if due.

        Called by the server's timer.
        """
        due = self.state.next_due()
        if due is not None and due <= self.clock():
            self._changed()
        for receiver in self.state.expire():
            for held in self._connections.values():
                for link, owned in list(held.receivers.items()):
                    if owned is receiver:
                        del held.receivers[link]
                        self._refuse(link, "com.microsoft:session-lock-lost",
                                     "the session lock expired")
        now = self.clock()
        for waiting in [w for w in self._waiting if w.deadline <= now]:
            self._waiting.remove(waiting)
            self._refuse(waiting.link, TIMEOUT, "The operation did not complete within the "
                         f"allotted timeout of {_hms(waiting.seconds)}: no session became "
                         "available.")
        self.settle_changes()
        if self.state_file is not None:
            self.state_file.save_if_due(self.state)

    def _changed(self) -> None:
        if self.state_file is not None:
            self.state_file.changed()

    # -- deliveries -----------------------------------------------------------------

    def on_delivery(self, event: Event) -> None:  # noqa: D102
        delivery, link = event.delivery, event.link
        if delivery is None or link is None:
            return
        if isinstance(link, ProtonReceiver):
            if delivery.readable and not delivery.partial:
                self._incoming(link, delivery)
        elif delivery.updated:
            self._disposition(link, delivery)
        self._changed()  # a settlement, a management request (renewals too: cheap, debounced)
        self.settle_changes()

    def _incoming(self, link: ProtonReceiver, delivery: Delivery) -> None:
        encoded = link.recv(delivery.pending) or b""
        address = link.remote_target.address or ""
        link.advance()
        try:
            if address == CBS or entity_path(address).endswith(MANAGEMENT):
                self._request(link, address, encoded)
            else:
                self._enqueue(entity_path(address), encoded)
        except Refused as refused:
            delivery.local.condition = _condition(refused.condition, refused.description)
            delivery.update(Delivery.REJECTED)
        except ValueError as exc:
            delivery.local.condition = _condition("amqp:decode-error", str(exc))
            delivery.update(Delivery.REJECTED)
        else:
            delivery.update(Delivery.ACCEPTED)
        delivery.settle()
        if link.credit < CREDIT // 2:
            link.flow(CREDIT - link.credit)

    def _enqueue(self, path: str, encoded: bytes) -> None:
        """Send one transfer's messages to ``path``; ``Refused`` if too large or refused."""
        if len(encoded) > self.namespace.max_message_size:
            raise Refused(MESSAGE_SIZE_EXCEEDED,
                          f"The message of {len(encoded)} bytes exceeds the limit of "
                          f"{self.namespace.max_message_size} bytes.")
        self.state.send(path, [wire.message_facts(part) for part in wire.unpack(encoded)])
        self._keep()  # accepted only once kept (the state file's invariant 2)

    def _keep(self) -> None:
        """Write the state file now: messages were sent or scheduled, kept before answered."""
        if self.state_file is not None:
            self.state_file.save(self.state)

    def _request(self, link: ProtonReceiver, address: str, encoded: bytes) -> None:
        request = Message()
        request.decode(encoded)
        held = self._connections.get(link.connection)
        reply_link = None if held is None else held.replies.get(address)
        if reply_link is None:
            raise Refused("amqp:precondition-failed", f"no response link for {address}")
        if address == CBS:
            reply = self._put_token(link, request)
        else:
            store = entity_path(address).removesuffix(MANAGEMENT)
            reply = self.management.answer(store, request)
        reply.correlation_id = request.id
        reply_link.send(reply)

    def _put_token(self, link: ProtonReceiver, request: Message) -> Message:
        """The answer to a CBS request: 200 and a grant kept, or 401/404 and why."""
        given: dict[Any, Any] = request.properties or {}
        properties = {str(name): value for name, value in given.items()}
        if str(properties.get("operation")) != "put-token":
            return Message(properties={"status-code": 400, "status-description":
                                       "the test server's $cbs answers put-token only"})
        body = request.body
        token = body.decode() if isinstance(body, bytes) else str(body)
        try:
            grant = auth.verify(token, str(properties.get("type", "")),
                                str(properties.get("name", "")), self.namespace.keys,
                                self.state.wall())
            if grant.path:
                self._check_audience(grant.path, str(properties.get("name", "")))
        except auth.TokenRefused as refused:
            _LOG.info("token refused", audience=properties.get("name"),
                      reason=refused.description)
            return Message(properties={"status-code": refused.status,
                                       "status-description": refused.description})
        grants = self._grants(link)  # a refreshed token replaces the one for its path
        grants[:] = [kept for kept in grants if kept.path.lower() != grant.path.lower()]
        grants.append(grant)
        return Message(properties={"status-code": 200, "status-description": "OK"})

    def _check_audience(self, path: str, audience: str) -> None:
        """:class:`~.auth.TokenRefused` with 404 unless ``path`` names an entity, as Service Bus."""
        try:
            self.state.check_entity(path.removesuffix(MANAGEMENT))
        except Refused as missing:
            if missing.condition != NOT_FOUND:
                raise
            raise auth.TokenRefused(404, f"The messaging entity '{audience}' could not be "
                                         f"found.") from missing

    def _disposition(self, link: Link, delivery: Delivery) -> None:
        state, remote = delivery.remote_state, delivery.remote
        if state == Delivery.ACCEPTED:
            outcome, reason, description = Outcome.COMPLETE, None, None
        elif state == Delivery.REJECTED:
            outcome = Outcome.DEAD_LETTER
            info = remote.condition.info if remote.condition is not None else None
            details = {str(k): v for k, v in info.items()} if isinstance(info, dict) else {}
            reason = details.get("DeadLetterReason")
            description = details.get("DeadLetterErrorDescription")
        elif state == Delivery.MODIFIED:
            outcome = (Outcome.DEFER if remote.undeliverable
                       else Outcome.ABANDON if remote.failed else Outcome.RELEASE)
            reason = description = None
        elif state == Delivery.RELEASED:
            outcome, reason, description = Outcome.RELEASE, None, None
        else:
            return
        try:
            self.state.settle(uuid.UUID(bytes_le=raw_tag(delivery)), outcome,
                              reason=None if reason is None else str(reason),
                              description=None if description is None else str(description))
        except Refused as refused:
            delivery.local.condition = _condition(refused.condition, refused.description)
            delivery.update(Delivery.REJECTED)
        else:
            if state == Delivery.MODIFIED:
                delivery.local.failed = remote.failed
                delivery.local.undeliverable = remote.undeliverable
            delivery.update(state)
        delivery.settle()
        _LOG.debug("settled", outcome=outcome.value, link=link.name, state=state)
