"""``python -m sharedstream.testing.servicebus --port N``: the Service Bus test server."""

from sharedstream.testing.servicebus.server import main

main()
