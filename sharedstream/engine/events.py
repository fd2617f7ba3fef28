"""``TriggerEvent``: what a trigger fires.

It sits on the hot path (a filter may build one per raw event), so it is a
slotted class with value equality and a readable repr, not a validation
model.
"""

from __future__ import annotations

from typing import Any

__all__ = ["TriggerEvent"]


class TriggerEvent:
    """An event fired by a trigger, carrying an arbitrary ``payload``.

    Payloads should identify the event the same way wherever the trigger
    runs, so a store can deduplicate an event fired twice (for example after
    a broker redelivery). Two events are equal when their payloads are equal;
    events are unhashable because payloads usually are.
    """

    __slots__ = ("payload",)

    def __init__(self, payload: Any = None) -> None:
        self.payload = payload

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TriggerEvent) or type(other) is not type(self):
            return NotImplemented
        return bool(self.payload == other.payload)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"TriggerEvent<{self.payload!r}>"
