"""A filter that raises on bad records, through the CLI on a real Kafka-protocol broker.

Each bad record fails the filter until the redelivery limit dead-letters it.
Only the failing watcher gets the redeliveries (the other one's filter sees
each record once: no duplicate to skip). The restart backoff is the record's
own: the second bad record starts again from the initial delay (it used to
carry on doubling from the first one's, so two bad records in five held the
partition's commits for minutes), and the delay the log names is the one
waited.
"""

from __future__ import annotations

import json
import os
import re
from collections import defaultdict
from pathlib import Path
from typing import Any

from tests.cli import ROOT, TriggererCli
from tests.kafka.conftest import KafkaHarness

DEFS = Path(__file__).with_name("bad_record_defs.py")
FAILED = re.compile(r"trigger failed; restarting .*delay_s=(?P<delay>[\d.]+) "
                    r"raw_event=(?P<raw>\S+)")


async def test_each_bad_record_gets_its_own_backoff_and_is_dead_lettered(
    harness: KafkaHarness, tmp_path: Path,
) -> None:
    stream = await harness.create_stream()
    assert stream.dead_letter is not None
    records = [{"id": i, "bad": i in (1, 3)} for i in range(5)]
    await harness.produce(stream, [json.dumps(r).encode() for r in records])
    env = {**os.environ, "PYTHONPATH": str(ROOT), "BAD_BOOTSTRAP": harness.bootstrap,
           "BAD_TOPIC": stream.name, "BAD_GROUP": stream.group, "BAD_DLQ": stream.dead_letter,
           "SHAREDSTREAM__TRIGGERER__RESTART_BACKOFF_INITIAL": "0.2"}
    cli = TriggererCli(tmp_path, env, DEFS)
    cli.run("init", "--path", str(cli.config))
    async def all_committed() -> bool:
        return await harness.committed(stream) == len(records)

    with cli.running(0, log_level="INFO") as process:  # INFO: the stop line's counts
        await cli.until(0, process, all_committed)

    letters = await harness.dead_letters(stream)
    assert sorted(letter.source for letter in letters) == [
        f"{stream.name}/0/1", f"{stream.name}/0/3"]
    events: list[dict[str, Any]] = json.loads(cli.run("events", "list", "--json"))
    by_asset: dict[str, list[int]] = defaultdict(list)
    for event in events:
        for asset in event["assets"]:
            by_asset[asset].append(event["payload"]["value"]["id"])
    assert sorted(by_asset["picky"]) == [0, 2, 4]
    assert sorted(by_asset["every"]) == [0, 1, 2, 3, 4]  # each once, redeliveries or not
    # The redeliveries went to picky alone: every's filter made no copy to skip.
    assert re.search(r"stopped stored=\d+ duplicates=0 ", cli.log(0)), cli.log(0)
    delays: dict[str, list[float]] = defaultdict(list)
    for match in FAILED.finditer(cli.log(0)):
        delays[match["raw"]].append(float(match["delay"]))
    # Two failures tolerated, the third dead-letters: each record's delays start afresh.
    assert delays == {f"{stream.name}/0/1": [0.2, 0.4, 0.8],
                      f"{stream.name}/0/3": [0.2, 0.4, 0.8]}, cli.log(0)
