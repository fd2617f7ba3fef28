"""``python -m sharedstream.testing.pubsub --port N``: the Pub/Sub test server."""

from sharedstream.testing.pubsub.server import main

main()
