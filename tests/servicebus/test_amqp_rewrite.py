"""Renumbering a client's deliveries for proton: ``sharedstream.testing.servicebus.amqp_rewrite``.

Pure: no socket, no proton. Frames are written out by hand here, as pyamqp
and proton encode them (``list8``, ``smalluint``); what the renumbering
re-encodes is written out as it must come out (``list32``, ``uint`` as
``0x70``), so the encoder is not checked against itself.
"""

from __future__ import annotations

import itertools
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sharedstream.testing.servicebus.amqp_rewrite import AmqpFramingError, DeliveryRenumbering

SASL_HEADER = b"AMQP\x03\x01\x00\x00"
AMQP_HEADER = b"AMQP\x00\x01\x00\x00"
CLIENT, SERVER = 0, 3  # the session's channel on each side: they differ, as they may
NULL, TRUE, FALSE = b"\x40", b"\x41", b"\x42"
ACCEPTED = b"\x00\x53\x24\x45"


def small(value: int) -> bytes:
    """A uint as pyamqp and proton write a small one (``smalluint``)."""
    return b"\x52" + bytes([value]) if value < 256 else b"\x70" + struct.pack(">I", value)


def uint32(value: int) -> bytes:
    """A uint as the renumbering writes one it changed."""
    return b"\x70" + struct.pack(">I", value)


def list8(code: int, *fields: bytes) -> bytes:
    body = b"".join(fields)
    return b"\x00\x53" + bytes([code, 0xC0, len(body) + 1, len(fields)]) + body


def list32(code: int, *fields: bytes) -> bytes:
    body = b"".join(fields)
    return b"\x00\x53" + bytes([code]) + b"\xd0" + struct.pack(">II", len(body) + 4,
                                                               len(fields)) + body


def frame(channel: int, body: bytes = b"", kind: int = 0) -> bytes:
    return struct.pack(">IBBH", 8 + len(body), 2, kind, channel) + body


def begin(next_outgoing_id: int = 0, remote_channel: int | None = None) -> bytes:
    remote = NULL if remote_channel is None else b"\x60" + struct.pack(">H", remote_channel)
    return list8(0x11, remote, small(next_outgoing_id), small(100), small(100))


def transfer(delivery_id: int | None, *, handle: int = 0, more: bool = False,
             settled: bool = False, tag: bytes = b"\xa0\x01t") -> bytes:
    return list8(0x14, small(handle), NULL if delivery_id is None else small(delivery_id), tag,
                 small(0), TRUE if settled else FALSE, TRUE if more else FALSE)


def disposition(first: int, last: int | None = None, *, receiver: bool = True,
                settled: bool = True) -> bytes:
    return list8(0x15, TRUE if receiver else FALSE, small(first),
                 NULL if last is None else small(last), TRUE if settled else FALSE, ACCEPTED)


def disposition_out(first: int, last: int, *, receiver: bool = True) -> bytes:
    """A disposition as the renumbering writes one it mapped."""
    return list32(0x15, TRUE if receiver else FALSE, uint32(first), uint32(last), TRUE, ACCEPTED)


OPEN = list8(0x10, b"\xa1\x01c")
SASL_CLIENT = SASL_HEADER + frame(0, list8(0x41, b"\xa3\x09ANONYMOUS"), kind=1) + AMQP_HEADER
SASL_SERVER = (SASL_HEADER + frame(0, list8(0x40, b"\xe0\x0b\x01\xa3\x09ANONYMOUS"), kind=1)
               + frame(0, list8(0x44, b"\x50\x00"), kind=1) + AMQP_HEADER)


def opened(renumbering: DeliveryRenumbering, next_outgoing_id: int = 0) -> None:
    """Both sides through SASL, open and begin, every byte passed unchanged."""
    client = SASL_CLIENT + frame(0, OPEN) + frame(CLIENT, begin(next_outgoing_id))
    server = SASL_SERVER + frame(0, OPEN) + frame(SERVER, begin(remote_channel=CLIENT))
    assert renumbering.from_client(client) == client
    assert renumbering.from_server(server) == server


def test_a_client_that_never_repeats_an_id_sees_every_byte_unchanged() -> None:
    renumbering = DeliveryRenumbering()
    opened(renumbering, next_outgoing_id=7)
    client = b"".join(frame(CLIENT, transfer(n) + b"\x00\x53\x75\xa0\x02hi") for n in (7, 8, 9))
    client += frame(CLIENT)  # a heartbeat
    client += frame(CLIENT, list8(0x13, small(1), small(100), small(10), small(100)))  # a flow
    assert renumbering.from_client(client) == client
    server = frame(SERVER, disposition(7, 9)) + frame(SERVER)
    assert renumbering.from_server(server) == server
    assert renumbering.unsettled == 0


def test_a_repeated_delivery_id_gets_the_next_one_and_its_settlement_comes_back_as_sent() -> None:
    renumbering = DeliveryRenumbering()
    opened(renumbering)
    payload = b"\x00\x53\x77\xa1\x04peek"
    assert renumbering.from_client(frame(CLIENT, transfer(0) + payload)) == frame(
        CLIENT, transfer(0) + payload)
    # three requests at once, all numbered 1 (and tagged alike) by the client
    sent = renumbering.from_client(frame(CLIENT, transfer(1) + payload) * 3)
    tag = b"\xa0\x01t"
    renumbered = [list32(0x14, small(0), uint32(n), tag, small(0), FALSE, FALSE)
                  for n in (1, 2, 3)]
    assert sent == frame(CLIENT, transfer(1) + payload) + b"".join(
        frame(CLIENT, performative + payload) for performative in renumbered[1:])
    assert renumbering.unsettled == 4
    # proton settles 0-3 at once: the client hears of 0 and 1, then of 1 twice more
    assert renumbering.from_server(frame(SERVER, disposition(0, 3))) == b"".join(
        frame(SERVER, disposition_out(first, last)) for first, last in ((0, 1), (1, 1), (1, 1)))
    assert renumbering.unsettled == 0
    # the client's counter went up once per send: ids follow on from 4 unchanged again
    assert renumbering.from_client(frame(CLIENT, transfer(4))) == frame(CLIENT, transfer(4))


def test_a_range_that_maps_to_ids_that_do_not_follow_on_is_split() -> None:
    renumbering = DeliveryRenumbering()
    opened(renumbering)
    renumbering.from_client(b"".join(frame(CLIENT, transfer(n)) for n in (0, 1, 1, 2, 3)))
    # relay ids 0-4 hold client ids 0, 1, 1, 2, 3; settling relay 1-3 unsettled, then 0-4
    assert renumbering.from_server(frame(SERVER, disposition(1, 3, settled=False))) == (
        frame(SERVER, list32(0x15, TRUE, uint32(1), uint32(1), FALSE, ACCEPTED))
        + frame(SERVER, list32(0x15, TRUE, uint32(1), uint32(2), FALSE, ACCEPTED)))
    assert renumbering.unsettled == 5
    assert renumbering.from_server(frame(SERVER, disposition(0, 4))) == (
        frame(SERVER, disposition_out(0, 1)) + frame(SERVER, disposition_out(1, 3)))
    assert renumbering.unsettled == 0


def test_a_disposition_of_the_client_as_sender_is_mapped_to_the_relay_ids() -> None:
    renumbering = DeliveryRenumbering()
    opened(renumbering)
    renumbering.from_client(b"".join(frame(CLIENT, transfer(n)) for n in (0, 0, 1)))
    assert renumbering.from_client(frame(CLIENT, disposition(0, receiver=False))) == frame(
        CLIENT, disposition_out(0, 1, receiver=False))
    assert renumbering.unsettled == 1
    # the client settling the server's deliveries (role receiver) is not renumbered
    assert renumbering.from_client(frame(CLIENT, disposition(0, 5))) == frame(
        CLIENT, disposition(0, 5))


def test_the_frames_of_one_delivery_keep_its_id_and_their_payload() -> None:
    renumbering = DeliveryRenumbering()
    opened(renumbering)
    renumbering.from_client(frame(CLIENT, transfer(0)) + frame(CLIENT, transfer(0)))  # 0 and 1
    body = bytes(range(256)) * 10
    parts = [frame(CLIENT, transfer(1, more=True) + body[:1000]),
             frame(CLIENT, transfer(None, more=True) + body[1000:2000]),
             frame(CLIENT, transfer(1) + body[2000:])]  # pyamqp repeats the id on each
    expected = [frame(CLIENT, list32(0x14, small(0), uint32(2), b"\xa0\x01t", small(0), FALSE,
                                     TRUE) + body[:1000]),
                parts[1],
                frame(CLIENT, list32(0x14, small(0), uint32(2), b"\xa0\x01t", small(0), FALSE,
                                     FALSE) + body[2000:])]
    assert renumbering.from_client(b"".join(parts)) == b"".join(expected)
    # a delivery on another link interleaved with one in progress gets an id of its own
    assert renumbering.from_client(
        frame(CLIENT, transfer(2, more=True)) + frame(CLIENT, transfer(2, handle=1))
        + frame(CLIENT, transfer(None))) == (
        frame(CLIENT, list32(0x14, small(0), uint32(3), b"\xa0\x01t", small(0), FALSE, TRUE))
        + frame(CLIENT, list32(0x14, small(1), uint32(4), b"\xa0\x01t", small(0), FALSE, FALSE))
        + frame(CLIENT, transfer(None)))


def test_deliveries_sent_settled_or_whose_link_detached_leave_the_table() -> None:
    renumbering = DeliveryRenumbering()
    opened(renumbering)
    renumbering.from_client(frame(CLIENT, transfer(0, settled=True)) + frame(CLIENT, transfer(0))
                            + frame(CLIENT, transfer(0, handle=1)))
    assert renumbering.unsettled == 2
    renumbering.from_client(frame(CLIENT, list8(0x16, small(1), TRUE)))  # detach handle 1
    assert renumbering.unsettled == 1
    renumbering.from_client(frame(CLIENT, list8(0x17)))  # end, then the server's
    renumbering.from_server(frame(SERVER, list8(0x17)))
    assert renumbering.unsettled == 0


def test_a_session_the_server_began_is_numbered_from_the_client_s_answer() -> None:
    renumbering = DeliveryRenumbering()
    client = SASL_CLIENT + frame(0, OPEN) + frame(CLIENT, begin(5, remote_channel=SERVER))
    server = SASL_SERVER + frame(0, OPEN) + frame(SERVER, begin())
    assert renumbering.from_server(server) == server
    assert renumbering.from_client(client) == client
    renumbering.from_client(frame(CLIENT, transfer(5)) + frame(CLIENT, transfer(5)))
    assert renumbering.from_server(frame(SERVER, disposition(6))) == frame(
        SERVER, disposition_out(5, 5))


CONVERSATION_CLIENT = (SASL_CLIENT + frame(0, OPEN) + frame(CLIENT, begin())
                       + b"".join(frame(CLIENT, transfer(n) + b"\x00\x53\x75\xa0\x03abc")
                                  for n in (0, 1, 1, 1, 2))
                       + frame(CLIENT, transfer(3, more=True) + b"x" * 300)
                       + frame(CLIENT, transfer(3) + b"y" * 300) + frame(CLIENT))
CONVERSATION_SERVER = (SASL_SERVER + frame(0, OPEN) + frame(SERVER, begin(remote_channel=CLIENT))
                       + frame(SERVER, disposition(0, 5)) + frame(SERVER))


@given(client_cuts=st.lists(st.integers(0, len(CONVERSATION_CLIENT)), max_size=20),
       server_cuts=st.lists(st.integers(0, len(CONVERSATION_SERVER)), max_size=8))
def test_bytes_in_pieces_of_any_size_come_out_as_when_whole(
        client_cuts: list[int], server_cuts: list[int]) -> None:
    whole = DeliveryRenumbering()
    expected_client = whole.from_client(CONVERSATION_CLIENT)
    expected_server = whole.from_server(CONVERSATION_SERVER)
    pieces = DeliveryRenumbering()
    assert b"".join(pieces.from_client(piece)
                    for piece in cut(CONVERSATION_CLIENT, client_cuts)) == expected_client
    assert b"".join(pieces.from_server(piece)
                    for piece in cut(CONVERSATION_SERVER, server_cuts)) == expected_server
    assert expected_client != CONVERSATION_CLIENT  # the repeats were renumbered
    assert pieces.unsettled == whole.unsettled == 0


def cut(data: bytes, at: list[int]) -> list[bytes]:
    bounds = [0, *sorted(at), len(data)]
    return [data[start:end] for start, end in itertools.pairwise(bounds)]


def test_a_first_header_that_is_not_amqp_s_passes_everything_on() -> None:
    renumbering = DeliveryRenumbering()
    hello = b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + frame(0, transfer(0)) * 2
    assert renumbering.from_client(hello[:5]) == b""
    assert renumbering.from_client(hello[5:]) == hello


@pytest.mark.parametrize("bad", [
    struct.pack(">IBBH", 8, 1, 0, 0),  # a data offset under 2
    struct.pack(">IBBH", 12, 4, 0, 0) + b"\x00" * 4,  # the offset past the frame's end
    frame(CLIENT, b"\x00\x53\x14\xc0\x10\x01\x52"),  # a list longer than its frame
    frame(CLIENT, list8(0x14, b"\x52\x00", b"\x71\x00\x00\x00\x01")),  # no uint delivery-id
], ids=["offset", "offset-past-end", "list-past-frame", "delivery-id-not-uint"])
def test_bytes_that_break_the_framing_are_refused(bad: bytes) -> None:
    renumbering = DeliveryRenumbering()
    opened(renumbering)
    with pytest.raises(AmqpFramingError):
        renumbering.from_client(bad)
