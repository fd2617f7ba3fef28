"""``TriggerEvent``: what a trigger fires.

It sits on the hot path (a filter may build one per raw event), so it is a
slotted class with value equality and a readable repr, not a validation
model. Airflow's ``TriggerEvent`` is a pydantic model; the two methods code
written for it calls, :meth:`TriggerEvent.model_dump` and
:meth:`TriggerEvent.model_dump_json`, give the same results here (see
:mod:`sharedstream.engine.payload_json`) and cost nothing until called.
"""

from __future__ import annotations

from typing import Any, Literal

from sharedstream.engine.payload_json import dumps, jsonable, python_dump

__all__ = ["TriggerEvent"]


class TriggerEvent:
    """An event fired by a trigger, carrying a ``payload`` (required as in Airflow; may be None).

    Payloads should identify the event the same way wherever the trigger
    runs, so a store can deduplicate an event fired twice (for example after
    a broker redelivery). Two events are equal when their payloads are equal;
    events are unhashable because payloads usually are. ``TriggerEvent()``
    without a payload raises ``TypeError`` naming ``payload``.
    """

    __slots__ = ("payload",)

    def __init__(self, payload: Any) -> None:
        self.payload = payload

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TriggerEvent) or type(other) is not type(self):
            return NotImplemented
        return bool(self.payload == other.payload)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"TriggerEvent<{self.payload!r}>"

    def model_dump(self, *, mode: Literal["python", "json"] = "python") -> dict[str, Any]:
        """``{"payload": payload}``, as Airflow's pydantic model dumps it.

        ``mode="python"`` keeps the payload's values (dataclasses become
        dicts); ``mode="json"`` converts them to JSON types (datetimes to ISO
        8601 text, tuples and sets to lists, ...). Raises ``TypeError`` for a
        value JSON cannot represent in ``json`` mode. Pure; safe from any task.
        """
        if mode == "json":
            return {"payload": jsonable(self.payload)}
        if mode != "python":
            raise ValueError(f"mode must be 'python' or 'json', got {mode!r}")
        return {"payload": python_dump(self.payload)}

    def model_dump_json(self, *, indent: int | None = None) -> str:
        """The event as JSON text, ``{"payload":...}``, byte for byte as Airflow's model renders it.

        Compact unless ``indent`` is given; non-ASCII text is kept as is.
        Raises ``TypeError`` for a payload value JSON cannot represent.
        """
        return dumps({"payload": self.payload}, indent=indent)
