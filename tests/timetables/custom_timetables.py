"""Custom timetables written the way Airflow's guide writes them (the seed's two examples).

``WorkWeekTimetable`` runs every Friday at 18:00 UTC covering the work week,
Monday 09:00 to Friday 18:00. ``TwiceDailyTimetable`` runs at 01:10 and 02:40
UTC each day, each run covering the time since the previous one. The
plugin test registers them through an entry point of an installed
distribution; the schedule tests check their runs.
"""

from __future__ import annotations

from datetime import UTC, datetime, time, timedelta

from sharedstream.timetables.base import (
    DagRunInfo,
    DataInterval,
    TimeRestriction,
    Timetable,
    utcnow,
)

WORK_WEEK = timedelta(days=4, hours=9)  # Monday 09:00 to Friday 18:00


class WorkWeekTimetable(Timetable):
    """Every Friday at 18:00 UTC, covering Monday 09:00 to Friday 18:00."""

    description = "Fridays at 18:00 UTC, covering the work week"

    @staticmethod
    def _friday_at_or_after(moment: datetime) -> datetime:
        moment = moment.astimezone(UTC)
        days_ahead = (4 - moment.weekday()) % 7
        friday = datetime.combine(moment.date() + timedelta(days=days_ahead), time(18), UTC)
        return friday if friday >= moment else friday + timedelta(days=7)

    def infer_manual_data_interval(self, *, run_after: datetime) -> DataInterval:
        """The last work week that ended at or before ``run_after``."""
        end = self._friday_at_or_after(run_after)
        if end > run_after:
            end -= timedelta(days=7)
        return DataInterval(end - WORK_WEEK, end)

    def next_dagrun_info(
        self,
        *,
        last_automated_data_interval: DataInterval | None,
        restriction: TimeRestriction,
    ) -> DagRunInfo | None:
        if last_automated_data_interval is not None:
            end = last_automated_data_interval.end + timedelta(days=7)
        elif restriction.earliest is not None:
            end = self._friday_at_or_after(restriction.earliest)
        else:
            end = self._friday_at_or_after(utcnow())
        if not restriction.catchup:
            end = max(end, self._friday_at_or_after(utcnow()))
        if restriction.latest is not None and end > restriction.latest:
            return None
        return DagRunInfo.interval(start=end - WORK_WEEK, end=end)


class TwiceDailyTimetable(Timetable):
    """At 01:10 and 02:40 UTC each day; a run covers the time since the previous run time."""

    description = "At 01:10 and 02:40 UTC"
    TIMES = (time(1, 10), time(2, 40))

    def _at_or_after(self, moment: datetime) -> datetime:
        day = moment.astimezone(UTC).date()
        while True:
            for at in self.TIMES:
                candidate = datetime.combine(day, at, UTC)
                if candidate >= moment:
                    return candidate
            day += timedelta(days=1)

    def _before(self, moment: datetime) -> datetime:
        day = moment.astimezone(UTC).date()
        while True:
            for at in reversed(self.TIMES):
                candidate = datetime.combine(day, at, UTC)
                if candidate < moment:
                    return candidate
            day -= timedelta(days=1)

    def infer_manual_data_interval(self, *, run_after: datetime) -> DataInterval:
        """From the run time before the last one up to ``run_after`` to that last one."""
        end = self._before(run_after + timedelta(microseconds=1))
        return DataInterval(self._before(end), end)

    def next_dagrun_info(
        self,
        *,
        last_automated_data_interval: DataInterval | None,
        restriction: TimeRestriction,
    ) -> DagRunInfo | None:
        if last_automated_data_interval is not None:
            end = self._at_or_after(last_automated_data_interval.end + timedelta(microseconds=1))
        elif restriction.earliest is not None:
            end = self._at_or_after(restriction.earliest)
        else:
            end = self._at_or_after(utcnow())
        if not restriction.catchup:
            end = max(end, self._at_or_after(utcnow()))
        if restriction.latest is not None and end > restriction.latest:
            return None
        return DagRunInfo.interval(start=self._before(end), end=end)
