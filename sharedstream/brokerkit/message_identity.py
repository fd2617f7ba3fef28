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
(CRC-32 over the bytes, no allocation beyond the result). Two messages
with the same name, the same stamp and the same CRC of their parts are
taken for the same message: a new message identical in all of these is
indistinguishable from a redelivery, and is treated as one.
"""

from __future__ import annotations

from zlib import crc32

__all__ = ["message_fingerprint"]


def message_fingerprint(stamp: object, *parts: bytes | None) -> str:
    """``"<stamp>-<CRC-32 of the parts, 8 hex digits>"``; ``None`` parts count as empty.

    ``stamp`` is what the broker stamped the message with (a timestamp in
    milliseconds, an enqueued time), written with ``str``.
    """
    digest = 0
    for part in parts:
        if part:
            digest = crc32(part, digest)
    return f"{stamp}-{digest:08x}"
