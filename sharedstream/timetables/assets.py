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

__all__ = ["AssetOrTimeSchedule", "AssetTriggeredTimetable"]


def _condition(owner: str, assets: AssetCondition | Sequence[AssetCondition]) -> AssetCondition:
    """``assets`` as one condition (a list: all of them); ``InvalidTimetable`` if it is none."""
    if isinstance(assets, AssetCondition):
        return assets
    if isinstance(assets, list | tuple) and assets:
        return AssetAll(*assets)
    raise InvalidTimetable(
        f"{owner}: assets must be an Asset, a non-empty list of assets or an expression with | "
        f"and &, got {assets!r}"
    )


def needs_several_events(condition: AssetCondition) -> bool:
    """Whether ``condition`` is satisfied only by events of two or more assets (an ``&``)."""
    if isinstance(condition, AssetAll):
        return len(condition.parts) > 1 or any(map(needs_several_events, condition.parts))
    if isinstance(condition, AssetAny):
        return any(map(needs_several_events, condition.parts))
    return False


class AssetTriggeredTimetable:
    """A schedule on an asset condition, with its batching (Airflow 3.4's ``airflow.sdk`` name).

    ``Dag(schedule=AssetTriggeredTimetable(assets, batch_asset_events=B))``
    is ``Dag(schedule=assets, batch_asset_events=B)``: ``assets`` is an
    asset, an expression with ``|`` and ``&``, or a non-empty list (all of
    them); ``batch_asset_events`` ``None`` (the default) takes ``[scheduler]
    batch_asset_events``. As in Airflow 3.4, ``batch_asset_events=False``
    with a condition only events of several assets satisfy (an ``&``) is
    refused: :class:`InvalidTimetable`, one line. It is not a
    :class:`~sharedstream.timetables.base.Timetable`: nothing in it is about
    time, and the Dag evaluates the condition as for any asset schedule.
    """

    def __init__(
        self,
        assets: AssetCondition | Sequence[AssetCondition],
        *,
        batch_asset_events: bool | None = None,
    ) -> None:
        condition = _condition("AssetTriggeredTimetable", assets)
        if batch_asset_events is not None and not isinstance(batch_asset_events, bool):
            raise InvalidTimetable(
                f"AssetTriggeredTimetable: batch_asset_events must be True, False or None, got "
                f"{batch_asset_events!r}"
            )
        if batch_asset_events is False and needs_several_events(condition):
            raise InvalidTimetable(
                "AssetTriggeredTimetable: a condition of several assets (&) needs "
                "batch_asset_events=True or None, not False"
            )
        self.asset_condition: AssetCondition = condition
        self.batch_asset_events = batch_asset_events

    def __repr__(self) -> str:
        return (f"AssetTriggeredTimetable({self.asset_condition!r}, "
                f"batch_asset_events={self.batch_asset_events!r})")


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
        condition = _condition("AssetOrTimeSchedule", assets)
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

