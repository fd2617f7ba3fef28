"""Two triggerer processes on one PostgreSQL run the same time schedule: each run is queued once.

Both run ``tests/runtime/schedule_defs.py`` (``tick``: every second, catching
up from a few seconds back), so both plan every run; the store's
compare-and-set on the DAG's bookkeeping lets one of them queue it.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from tests.scaling.conftest import Cluster, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(60)]

DEFS = Path(__file__).resolve().parents[1] / "runtime" / "schedule_defs.py"


def test_two_triggerers_queue_each_scheduled_run_once(
    postgres_database: str, cluster_factory: Callable[..., Cluster],
) -> None:
    start = (datetime.now(UTC) - timedelta(seconds=3)).replace(microsecond=0)
    cluster = cluster_factory(postgres_database, SCHEDULE_START=start.isoformat(),
                              SHAREDSTREAM__SCHEDULER__MAX_CATCHUP_RUNS_PER_LOOP="1")
    both = [cluster.start(i, DEFS, log_level="DEBUG") for i in (0, 1)]

    def runs() -> list[str]:
        return [r["logical_date"] for r in cluster.json("runs", "list", "--dag", "tick")][::-1]

    wait_until(lambda: len(runs()) >= 8, 30, "8 runs of tick")
    for proc in both:
        proc.send_signal(signal.SIGTERM)
    assert [proc.wait(timeout=30) for proc in both] == [0, 0]
    dates = [datetime.fromisoformat(x) for x in runs()]
    assert dates == [start + timedelta(seconds=n) for n in range(len(dates))]  # once each
    queued = [cluster.log(i).count("queued scheduled runs dag_id=tick ") for i in (0, 1)]
    lost = [cluster.log(i).count("moved on under this plan; planning again dag_id=tick ")
            for i in (0, 1)]
    print(f"\npasses that queued runs, by triggerer: {queued}; plans that lost the race: {lost}")
    assert sum(queued) >= 1
