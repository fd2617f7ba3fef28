"""Run a timetable the way the runtime does, and print its runs as a table to compare by eye.

:func:`runs` asks ``next_dagrun_info`` repeatedly, feeding each answer's data
interval back as the last automated one, with the clock frozen at ``now``;
each row is ``(run_after, data_interval.start, data_interval.end)`` written
in ``tz`` to the minute (``"2026-03-29T03:00+02:00"``), so a table in a test
reads like a calendar the test's author checked by hand.
"""

from __future__ import annotations

from datetime import UTC, datetime, tzinfo

from sharedstream.timetables.base import (
    DagRunInfo,
    DataInterval,
    TimeRestriction,
    Timetable,
    use_clock,
)

Row = tuple[str, str, str]


def show(moment: datetime, tz: tzinfo = UTC) -> str:
    return moment.astimezone(tz).isoformat(timespec="minutes")


def row(info: DagRunInfo, tz: tzinfo = UTC) -> Row:
    return (show(info.run_after, tz), show(info.data_interval.start, tz),
            show(info.data_interval.end, tz))


def runs(
    timetable: Timetable,
    count: int,
    *,
    now: datetime,
    earliest: datetime | None = None,
    latest: datetime | None = None,
    catchup: bool = False,
    last: DataInterval | None = None,
    tz: tzinfo = UTC,
) -> list[Row]:
    """Up to ``count`` runs in order (fewer if the timetable answers ``None``)."""
    restriction = TimeRestriction(earliest, latest, catchup)
    rows: list[Row] = []
    with use_clock(now):
        for _ in range(count):
            info = timetable.next_dagrun_info(last_automated_data_interval=last,
                                              restriction=restriction)
            if info is None:
                break
            rows.append(row(info, tz))
            last = info.data_interval
    return rows


def run_afters(rows: list[Row]) -> list[str]:
    return [r[0] for r in rows]
