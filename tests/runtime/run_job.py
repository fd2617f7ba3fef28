"""A DAG run's job for the dispatch tests: records the run it got, then succeeds or fails.

Reads the run document on standard input and appends one JSON line
``{"run_id", "dag_id", "attempt", "ids", "by"}`` to ``$RUN_LOG`` (``ids``:
each event's ``id``, or a ticker's ``n``; ``by``: the triggerer that ran
it, this process's parent; one ``write``
of an ``O_APPEND`` file: lines of concurrent jobs never mix). Then sleeps
``$RUN_SLEEP`` seconds (default 0) and exits 3, after printing why, when an
event's ``id`` is in ``$RUN_FAIL_IDS`` (comma-separated) and the file
``$RUN_FIXED`` does not exist; else exits 0.
"""

from __future__ import annotations

import json
import os
import sys
import time

document = json.load(sys.stdin)
ids = [event["payload"].get("id", event["payload"].get("n")) for event in document["events"]]
line = json.dumps({"run_id": document["run_id"], "dag_id": document["dag_id"],
                   "attempt": document["attempt"], "ids": ids, "by": os.getppid()}) + "\n"
fd = os.open(os.environ["RUN_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
try:
    os.write(fd, line.encode())
finally:
    os.close(fd)
time.sleep(float(os.environ.get("RUN_SLEEP", "0")))
failing = {int(i) for i in os.environ.get("RUN_FAIL_IDS", "").split(",") if i}
if failing & set(ids) and not os.path.exists(os.environ.get("RUN_FIXED", "/nonexistent")):
    print(f"order {sorted(failing & set(ids))[0]} cannot be processed")
    sys.exit(3)
print(f"processed orders {ids}")
