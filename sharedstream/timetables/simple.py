"""``@once``: a single run (``airflow.timetables.simple``).

:class:`OnceTimetable` queues one run, at the DAG's start date (or, with no
start date, as soon as it is first asked), and none after it.
"""

from __future__ import annotations

import datetime as dt

from sharedstream.timetables.base import (
    DagRunInfo,
    DataInterval,
    TimeRestriction,
    Timetable,
    utcnow,
)
from sharedstream.timetables.values import require_aware

__all__ = ["OnceTimetable"]


class OnceTimetable(Timetable):
    """One run, at ``earliest`` (the start date) or now; ``schedule="@once"``."""

    periodic = False
    description = "Once, as soon as possible"

    @property
    def summary(self) -> str:
        """``@once``."""
        return "@once"

    def infer_manual_data_interval(self, *, run_after: dt.datetime) -> DataInterval:
        """The instant ``run_after``."""
        return DataInterval.exact(run_after)

    def next_dagrun_info(
        self,
        *,
        last_automated_data_interval: DataInterval | None,
        restriction: TimeRestriction,
    ) -> DagRunInfo | None:
        """The one run, unless it has happened or falls after ``latest``."""
        if last_automated_data_interval is not None:
            return None
        if restriction.earliest is not None:
            run_after = require_aware(restriction.earliest, "restriction.earliest")
        else:
            run_after = utcnow()
        if restriction.latest is not None and run_after > require_aware(
                restriction.latest, "restriction.latest"):
            return None
        return DagRunInfo.exact(run_after)
