"""The Service Bus test server's AMQP port: a relay that renumbers deliveries in front of proton.

Proton listens on a loopback port of its own, plain; clients reach the
server's AMQP port through :class:`AmqpFront`, which ends TLS itself (when
the server serves ``amqps``) and relays each connection's bytes both ways
through a :class:`~.amqp_rewrite.DeliveryRenumbering`: azure-servicebus
7.15 gives overlapping management requests one delivery-id, which Service
Bus takes and proton refuses; the renumbering gives proton its sequence
and the client its own ids back. It is a :class:`~.front.RelayFront`: an
asyncio loop on a thread of its own, beside the proton container's.

Invariants:

1. Every byte proton sends reaches the client, in order, up to proton's
   end of the connection (its close frame, its error, a refused SASL),
   and then the client's connection ends. Every byte the client sends
   reaches proton; the client's end of the connection is passed on as a
   half close, so proton reads it as a client gone, and the relay waits
   up to :data:`.front.CLOSE_TIMEOUT` for proton's own end.
2. A connection proton does not take (its port does not answer within
   :data:`.front.HANDSHAKE_TIMEOUT`) is closed at once, with one log line.
3. Bytes that break AMQP's framing (:class:`~.amqp_rewrite.AmqpFramingError`)
   end both connections, with one log line naming the side.
4. Bounded as every front is (:mod:`.front`), plus the renumbering's
   bounds (:data:`.amqp_rewrite.MAX_PERFORMATIVE`); :meth:`AmqpFront.stop`
   ends every connection and the thread.
"""

from __future__ import annotations

import asyncio
import socket

from sharedstream.engine.keyvalue_log import key_value_logger
from sharedstream.testing.servicebus.amqp_rewrite import AmqpFramingError, DeliveryRenumbering
from sharedstream.testing.servicebus.front import (
    CLOSE_TIMEOUT,
    RelayFront,
    Upstream,
    end,
    pump,
    served_tls,
)
from sharedstream.testing.tls import ServerCertificates

__all__ = ["AmqpFront"]

_log = key_value_logger(__name__)


class AmqpFront(RelayFront):
    """The relay of the module docstring, serving an already listening socket.

    ``listening``: the server's public AMQP port, bound and listening; the
    front closes it when it stops. ``proton_host``/``proton_port``:
    proton's own port (plain). ``certificates``: serve ``amqps`` with them
    (``None``: plain AMQP). :meth:`start` and :meth:`stop` are called from
    any one thread; all else runs on the front's own.
    """

    def __init__(self, listening: socket.socket, proton_host: str, proton_port: int,
                 certificates: ServerCertificates | None = None) -> None:
        super().__init__(listening, served_tls(certificates), name="servicebus-amqp-front")
        self._proton = Upstream(proton_host, proton_port)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Relay one client's connection to proton and back, renumbered (module docstring)."""
        peer = writer.get_extra_info("peername")
        try:
            proton_reader, proton_writer = await self._proton.connect()
        except (OSError, TimeoutError) as exc:
            _log.warning("proton's port does not answer; closing a client's connection",
                         peer=peer, port=self._proton.port, error=repr(exc))
            return
        try:
            await _Relay(reader, writer, proton_reader, proton_writer, peer).run()
        finally:
            await end(proton_writer)


class _Relay:
    """One client's connection and proton's, through one renumbering."""

    def __init__(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter,
                 proton_reader: asyncio.StreamReader, proton_writer: asyncio.StreamWriter,
                 peer: object) -> None:
        self._client_reader, self._client_writer = client_reader, client_writer
        self._proton_reader, self._proton_writer = proton_reader, proton_writer
        self._peer = peer
        self._renumbering = DeliveryRenumbering()

    async def run(self) -> None:
        """Relay until proton's side ends, or the client's and then proton's (invariant 1)."""
        async with asyncio.TaskGroup() as tasks:
            to_client = tasks.create_task(self._to_client(), name="amqp-to-client")
            try:
                if await self._from_client() and not self._proton_writer.is_closing():
                    self._proton_writer.write_eof()  # proton reads the end, then closes
                    await asyncio.wait({to_client}, timeout=CLOSE_TIMEOUT)
            except OSError:  # proton's connection broke as the end was passed on
                _log.debug("proton's connection broke at a client's end", peer=self._peer)
            finally:
                to_client.cancel()

    async def _from_client(self) -> bool:
        """Relay the client's bytes; whether its side ended cleanly (else both end)."""
        try:
            await pump(self._client_reader, self._proton_writer, self._renumbering.from_client)
        except AmqpFramingError as error:
            _log.warning("a client's bytes are not AMQP framing; closing its connection",
                         peer=self._peer, error=str(error))
            return False
        except OSError:  # either connection broke: ending both is all there is to do
            _log.debug("an AMQP client's connection broke", peer=self._peer, exc_info=True)
            return False
        return True

    async def _to_client(self) -> None:
        try:
            await pump(self._proton_reader, self._client_writer, self._renumbering.from_server)
        except AmqpFramingError as error:  # proton's own bytes: a bug of the renumbering's
            _log.error("proton's bytes are not AMQP framing as read; closing a connection",
                       peer=self._peer, error=str(error))
        except OSError:
            _log.debug("an AMQP relay's connection broke", peer=self._peer, exc_info=True)
        self._client_writer.close()  # the client's side then ends: _from_client reads the end
