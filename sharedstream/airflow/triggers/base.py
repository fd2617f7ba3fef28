"""Mirror of ``airflow.triggers.base``: the trigger classes and ``TriggerEvent``.

``from airflow.triggers.base import BaseEventTrigger, BaseTrigger, TriggerEvent``
ports as ``from sharedstream.airflow.triggers.base import ...``. The objects
are :mod:`sharedstream`'s own (see ``docs/airflow.md`` for the differences).
"""

from sharedstream.engine.events import TriggerEvent
from sharedstream.engine.trigger import BaseEventTrigger, BaseTrigger

__all__ = ["BaseEventTrigger", "BaseTrigger", "TriggerEvent"]
