"""``sharedstream deadletters redrive`` against a real Kafka-protocol broker, through the CLI.

A triggerer registers the watchers of ``connection_defs.py`` (their broker
comes from a connection); dead letters are then kept in the store as a
producer's fallback keeps them, and re-driven: they arrive on their topic
again, body and headers, and the store records it. What cannot be
re-driven (kept in part, triggers gone) is refused in one line each.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

from sharedstream.engine.producer import DeadLetter
from sharedstream.store import SqliteStore
from sharedstream.store.base import DEAD_LETTER_PAYLOAD_LIMIT
from tests.kafka.conftest import KafkaHarness
from tests.kafka.test_connections_e2e import connection_cli


async def test_kept_dead_letters_are_redriven_to_their_topic(
    harness: KafkaHarness, tmp_path: Path,
) -> None:
    stream = await harness.create_stream(dead_letter=False)
    cli = connection_cli(harness, stream, tmp_path)
    with cli.running(0, log_level=None):  # registers the watchers' triggers
        await asyncio.to_thread(cli.wait_for_log, 0, "definitions registered")
    [orders] = [t for t in json.loads(cli.run("triggers", "list", "--json"))
                if t["watchers"] == ["orders/all"]]

    def letter(offset: int, payload: bytes, triggers: tuple[str, ...]) -> DeadLetter:
        return DeadLetter(stream=f"kafka {stream.name}", source=f"{stream.name}/0/{offset}",
                          reason="rejected; the dead-letter topic refused it", triggers=triggers,
                          payload=payload, headers=(("trace", b"\x01\x02"),))

    with SqliteStore(tmp_path / "sharedstream.db") as store:
        store.migrate()
        for kept in (letter(7, b'{"id": 7, "kind": "order"}', (str(orders["id"]),)),
                     letter(8, b"x" * (DEAD_LETTER_PAYLOAD_LIMIT + 10), (str(orders["id"]),)),
                     letter(9, b'{"id": 9}', ("9999",))):
            assert store.add_dead_letter(kept)
    listed = {row["source"].rsplit("/", 1)[1]: row["id"]
              for row in json.loads(cli.run("deadletters", "list", "--json"))}

    result = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "sharedstream", "--config", str(cli.config), "deadletters",
         "redrive", "--stream", f"kafka {stream.name}"],
        cwd=tmp_path, env=cli.env, capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 2, result.stderr
    assert result.stdout == (f"re-drove 1 dead letter of kafka {stream.name} to its source: "
                             f"{listed['7']}\n")
    refused = sorted(result.stderr.splitlines())
    assert refused == [
        f"sharedstream: dead letter {listed['8']}: only {DEAD_LETTER_PAYLOAD_LIMIT} of its "
        f"{DEAD_LETTER_PAYLOAD_LIMIT + 10} bytes were kept; it cannot be re-driven",
        f"sharedstream: dead letter {listed['9']}: none of its triggers (9999) is in the store",
    ]
    [copy] = await harness.read_all(stream.name)
    assert copy.value == b'{"id": 7, "kind": "order"}'
    assert list(copy.headers) == [("trace", b"\x01\x02")]
    rows = {row["id"]: row for row in json.loads(cli.run("deadletters", "list", "--json"))}
    assert rows[listed["7"]]["redrives"] == 1
    assert rows[listed["7"]]["redriven_at"] is not None
    assert rows[listed["8"]]["redrives"] == 0
    again = cli.run("deadletters", "redrive", str(listed["7"]))  # by id: once more
    assert again.startswith(f"re-drove 1 dead letter of kafka {stream.name}")
    assert len(await harness.read_all(stream.name)) == 2
    nothing = cli.run("deadletters", "redrive", "--stream", "kafka elsewhere")
    assert nothing == "(no dead letter to re-drive)\n"
