"""A definitions file with time-scheduled DAGs only (no watcher): for the schedule loop's tests.

``tick`` runs every second from ``SCHEDULE_START`` (an ISO time the test sets
a few seconds in the past), catching up; ``never`` has no schedule.
"""

import os
from datetime import datetime, timedelta

from sharedstream.definitions import Dag

START = datetime.fromisoformat(os.environ["SCHEDULE_START"])

tick = Dag("tick", schedule=timedelta(seconds=1), start_date=START, catchup=True)
never = Dag("never", schedule=None)
