"""An Azure Service Bus test server: a subset of the service, for the real SDK, over AMQP 1.0.

Not an emulator: it covers what sharedstream's Service Bus module and its
tests use, and refuses or lacks the rest; docs/testing.md lists both. The
real, unmodified ``azure-servicebus`` SDK (sync and ``azure.servicebus.aio``)
reaches it with the connection string
``Endpoint=sb://127.0.0.1:<port>;SharedAccessKeyName=k;SharedAccessKey=v;UseDevelopmentEmulator=true;``
(plain AMQP, SASL ANONYMOUS; CBS tokens are checked against the
namespace's keys, :mod:`.auth`).

* :mod:`.model` - messages, correlation filters, entity and namespace
  settings, keys, outcomes;
* :mod:`.auth` - shared access signatures: token checks and link rights
  (no AMQP import);
* :mod:`.state` - queues, topics, subscriptions, locks, sessions and
  dead-letter sub-queues as a synchronous state machine with injected clocks
  (no AMQP import), over the records of :mod:`.store`;
* :mod:`.config` - the entities to create at start (command line specs, a
  JSON document);
* :mod:`.wire`, :mod:`.management`, :mod:`.service` - the AMQP side on
  ``python-qpid-proton``: encoded messages, the ``$management`` node, links,
  CBS, settlement and credit;
* :mod:`.state_file` - the optional ``--state-file`` that keeps entities and
  messages across a restart (locks are lost, as with a real outage);
* :mod:`.amqp_rewrite`, :mod:`.amqp_front` - the AMQP port: a relay in
  front of proton (which listens on loopback) that ends TLS and renumbers
  the client's delivery-ids as Service Bus tolerates them (pure, and on
  sockets);
* :mod:`.websocket`, :mod:`.websocket_front` - AMQP over WebSockets
  (``--websocket-port``): RFC 6455 without I/O, and the relay that serves
  it in front of the AMQP port;
* :mod:`.front` - what both relays share: an asyncio loop on a thread of
  its own, TLS, bounded pumps, a stop that ends every connection;
* :mod:`.server` - :func:`~.server.serve` and the command line
  ``python -m sharedstream.testing.servicebus --port N --queue orders ...``.

Start it from tests with :func:`sharedstream.testing.brokers.servicebus_server`
or the ``servicebus_connection_string`` fixture. Importing this package,
:mod:`.model`, :mod:`.auth`, :mod:`.store`, :mod:`.state` or :mod:`.config` imports no proton
module, nor do :mod:`.amqp_rewrite`, :mod:`.amqp_front`, :mod:`.front`,
:mod:`.websocket` and :mod:`.websocket_front`; the others do.
"""
