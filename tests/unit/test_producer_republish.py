"""``SharedStreamProducer.republish``: a producer that does not implement it says so."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest

from sharedstream.engine.producer import AdvanceItem, DeadLetter, SharedStreamProducer


class OrdersProducer(SharedStreamProducer):
    async def open_stream(self) -> AsyncIterator[tuple[Any, Any]]:
        yield 1, 1

    async def advance(self, batch: Sequence[AdvanceItem]) -> None:
        return None


async def test_the_default_refuses_naming_the_producer_class() -> None:
    letter = DeadLetter(stream="orders", source="orders/0/7", reason="rejected",
                        triggers=("3",), payload=b"{}")

    with pytest.raises(NotImplementedError,
                       match=r"^OrdersProducer cannot republish dead letters$"):
        await OrdersProducer().republish([letter])
