"""Asset-or-time schedules (``airflow.timetables.assets``).

:class:`AssetOrTimeSchedule` queues a run whenever either side says so: its
``timetable`` (every question of the timetable contract is passed to it
unchanged) or its asset condition (an :class:`~sharedstream.assets.Asset`,
``a & b``, ``a | b``, or a list meaning all of them), which the runtime
evaluates as it does for ``Dag(schedule=<assets>)`` and reads from
:attr:`AssetOrTimeSchedule.asset_condition`. The two sides are independent:
an asset-triggered run does not move the time schedule, and a timed run does
not consume asset events.

Stored, the timetable is nested (class path and data, rebuilt through the
same registry as the outer timetable) and the condition is its schedule tree
(``{"asset": name}``, ``{"all": [...]}``, ``{"any": [...]}``).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

from sharedstream.assets.conditions import Asset, AssetAll, AssetAny, AssetCondition
from sharedstream.timetables.base import (
    DagRunInfo,
    DataInterval,
    TimeRestriction,
    Timetable,
    deserialize_timetable,
    serialize_timetable,
)
from sharedstream.timetables.values import InvalidTimetable

__all__ = ["AssetOrTimeSchedule"]


class AssetOrTimeSchedule(Timetable):
    """Runs on ``timetable`` and whenever ``assets`` (an asset condition) is satisfied."""

    def __init__(
        self, *, timetable: Timetable, assets: AssetCondition | Sequence[AssetCondition]
    ) -> None:
        if not isinstance(timetable, Timetable):
            raise InvalidTimetable(
                f"AssetOrTimeSchedule: timetable must be a Timetable, got "
                f"{type(timetable).__qualname__}"
            )
        if isinstance(timetable, AssetOrTimeSchedule):
            raise InvalidTimetable("AssetOrTimeSchedule: asset timetables cannot be nested")
        if isinstance(assets, AssetCondition):
            condition: AssetCondition = assets
        elif isinstance(assets, list | tuple) and assets:
            condition = AssetAll(*assets)
        else:
            raise InvalidTimetable(
                "AssetOrTimeSchedule: assets must be an Asset, a non-empty list of assets or an "
                f"expression with | and &, got {assets!r}"
            )
        self.timetable = timetable
        self.asset_condition: AssetCondition = condition
        self.description = f"Triggered by assets or {timetable.description}"
        self.periodic = timetable.periodic
        self.can_be_scheduled = timetable.can_be_scheduled

    @property
    def summary(self) -> str:
        """``Asset or <the timetable's summary>``."""
        return f"Asset or {self.timetable.summary}"

    def next_dagrun_info(
        self,
        *,
        last_automated_data_interval: DataInterval | None,
        restriction: TimeRestriction,
    ) -> DagRunInfo | None:
        """The timetable's next run."""
        return self.timetable.next_dagrun_info(
            last_automated_data_interval=last_automated_data_interval, restriction=restriction)

    def infer_manual_data_interval(self, *, run_after: dt.datetime) -> DataInterval:
        """The timetable's data interval for a manual run."""
        return self.timetable.infer_manual_data_interval(run_after=run_after)

    def generate_run_id(
        self, *, run_type: str, run_after: dt.datetime, data_interval: DataInterval | None
    ) -> str:
        """The timetable's run id (asset-triggered runs too: ``asset_triggered__<date>``)."""
        return self.timetable.generate_run_id(
            run_type=run_type, run_after=run_after, data_interval=data_interval)

    def serialize(self) -> dict[str, Any]:
        """The nested timetable and the condition's schedule tree."""
        return {
            "timetable": serialize_timetable(self.timetable),
            "asset_condition": self.asset_condition.to_tree(),
        }

    @classmethod
    def deserialize(cls, data: dict[str, Any]) -> AssetOrTimeSchedule:
        """Inverse of :meth:`serialize`; the nested class must be registered too."""
        return cls(
            timetable=deserialize_timetable(data["timetable"]),
            assets=_condition_from_tree(data["asset_condition"]),
        )


def _condition_from_tree(tree: dict[str, Any]) -> AssetCondition:
    condition: AssetCondition
    if "asset" in tree:
        condition = Asset(tree["asset"])
    elif "all" in tree:
        condition = AssetAll(*(_condition_from_tree(part) for part in tree["all"]))
    elif "any" in tree:
        condition = AssetAny(*(_condition_from_tree(part) for part in tree["any"]))
    else:
        raise InvalidTimetable(f"stored asset condition {tree!r} is not an asset, all or any")
    return condition

