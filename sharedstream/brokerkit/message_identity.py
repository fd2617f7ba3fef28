"""Message fingerprints: what tells a redelivery from a new message that got the same name.

A producer names each raw event (``SharedStreamProducer.raw_event_name``)
with what the broker identifies it by: a Kafka offset, a Service Bus
sequence number. Those names repeat when the broker forgets what it
assigned (a topic or entity deleted and created again, its storage reset),
and the store would then take a new message for a redelivery of the one
stored under that name. A fingerprint
(``SharedStreamProducer.raw_event_fingerprint``) is what the store compares
besides the name: it is made of what the broker keeps with the message and
returns unchanged on every redelivery (its timestamp, its bytes), never of
anything that changes between deliveries (a delivery count, a lock).

Contract of :func:`message_fingerprint`: the same arguments give the same
text in every process and every release (it is stored), and it is cheap
(CRC-32 over the bytes, a few hundred nanoseconds). Two messages
with the same name, the same stamp and the same CRC of their parts are
taken for the same message: a new message identical in all of these is
indistinguishable from a redelivery, and is treated as one.
"""

from __future__ import annotations

from zlib import crc32

__all__ = ["message_fingerprint"]


def message_fingerprint(stamp: object, data: bytes | None, key: bytes | None = None) -> str:
    """``"<stamp>-<CRC-32 of key then data, 8 hex digits>"``; ``None`` counts as empty.

    ``stamp`` is what the broker stamped the message with (a timestamp in
    milliseconds, an enqueued time), written with ``str``; ``data`` its
    body or value, ``key`` its key if it has one.
    """
    return f"{stamp}-{crc32(data or b'', crc32(key or b'')):08x}"
