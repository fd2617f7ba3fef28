"""The ``command`` target (the built-in ``local``): callables and real child processes."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from sharedstream.dispatch.command import CommandTarget
from sharedstream.dispatch.document import EventDocument, RunDocument
from sharedstream.dispatch.target import TargetContext, TargetError, check_options

NOW = datetime(2026, 11, 28, 12, 0, tzinfo=UTC)


def document(dag_id: str = "ship", run_id: str = "asset_triggered__000000000007") -> RunDocument:
    event = EventDocument(asset="orders", asset_event_id=7, event_id=5,
                          payload={"id": 5, "amount": 30}, created_at=NOW,
                          trace_parent="00-" + "1" * 32 + "-" + "2" * 16 + "-01")
    return RunDocument(dag_id=dag_id, run_id=run_id, run_type="asset_triggered", queued_at=NOW,
                       logical_date=None, data_interval_start=None, data_interval_end=None,
                       conf=None, trace_parent=event.trace_parent, events=(event,), attempt=2)


def target(runnables: dict[str, object] | None = None, **options: Any) -> CommandTarget:
    settings = check_options(CommandTarget, options, "[targets.local]")
    return CommandTarget("local", settings,
                         TargetContext(runnables or {}, lambda _: None))  # type: ignore[arg-type,return-value]


def script(tmp_path: Path, body: str) -> list[str]:
    path = tmp_path / "job.py"
    path.write_text(body)
    return [sys.executable, str(path)]


async def deliver(found: CommandTarget, run: RunDocument | None = None) -> Any:
    states: list[str] = []
    delivery = await found.deliver(run or document(), states.append)
    assert states == ["running"]
    return delivery


async def test_a_function_gets_the_document_and_its_return_is_the_output() -> None:
    seen: list[RunDocument] = []

    def ship(run: RunDocument) -> str:
        seen.append(run)
        return f"shipped order {run.events[0].payload['id']}"

    delivery = await deliver(target({"ship": ship}))
    assert (delivery.state, delivery.output) == ("success", "shipped order 5")
    assert seen[0].run_id == "asset_triggered__000000000007"


async def test_a_coroutine_function_runs_on_the_loop() -> None:
    async def ship(run: RunDocument) -> None:
        await asyncio.sleep(0)

    assert (await deliver(target({"ship": ship}))).state == "success"


async def test_a_function_that_raises_fails_the_run_with_its_traceback() -> None:
    def ship(run: RunDocument) -> None:
        raise ValueError("no stock for order 5\nsecond line")

    delivery = await deliver(target({"ship": ship}))
    assert (delivery.state, delivery.detail) == ("failed", "ValueError: no stock for order 5")
    assert "Traceback" in delivery.output
    assert "no stock" in delivery.output


async def test_a_function_past_its_timeout_fails_the_run() -> None:
    async def ship(run: RunDocument) -> None:
        await asyncio.sleep(10)

    delivery = await deliver(target({"ship": ship}, timeout=0.05))
    assert (delivery.state, delivery.detail) == ("failed", "did not finish within 0.05 s")


async def test_a_command_reads_the_document_on_stdin_and_its_environment(
        tmp_path: Path) -> None:
    argv = script(tmp_path, (
        "import json, os, sys\n"
        "doc = json.load(sys.stdin)\n"
        "print(doc['run_id'], doc['events'][0]['payload']['amount'], doc['attempt'])\n"
        "print(os.environ['SHAREDSTREAM_RUN_ID'], os.environ['SHAREDSTREAM_ATTEMPT'],\n"
        "      os.environ['TRACEPARENT'][:5])\n"
    ))
    delivery = await deliver(target({"ship": argv}))
    assert delivery.state == "success"
    assert delivery.output.splitlines() == [
        "asset_triggered__000000000007 30 2", "asset_triggered__000000000007 2 00-11"]


async def test_a_command_can_take_the_document_as_a_file(tmp_path: Path) -> None:
    argv = script(tmp_path, "import json, sys\nprint(json.load(open(sys.argv[1]))['dag_id'])\n")
    delivery = await deliver(target({"ship": [*argv, "{run_file}"]}))
    assert (delivery.state, delivery.output) == ("success", "ship\n")


async def test_a_failing_command_fails_the_run_with_its_last_line(tmp_path: Path) -> None:
    argv = script(tmp_path, "import sys\nprint('step 1 ok')\nprint('no stock', file=sys.stderr)\n"
                            "sys.exit(3)\n")
    delivery = await deliver(target({"ship": argv}))
    assert (delivery.state, delivery.detail) == ("failed", "exit status 3: no stock")
    assert delivery.output == "step 1 ok\nno stock\n"


async def test_a_hanging_command_is_stopped_with_its_children(tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    argv = script(tmp_path, (
        "import subprocess, sys, time\n"
        f"child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        f"open({str(pid_file)!r}, 'w').write(str(child.pid))\n"
        "time.sleep(60)\n"
    ))
    began = time.monotonic()
    delivery = await deliver(target({"ship": argv}, timeout=1.0))
    assert delivery.state == "failed"
    assert delivery.detail == "did not finish within 1 s; stopped"
    assert time.monotonic() - began < 8
    child = int(pid_file.read_text())
    for _ in range(100):  # the child was in the command's process group: it got SIGTERM too
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        await asyncio.sleep(0.05)
    else:
        pytest.fail("the command's child survived its timeout")


async def test_only_the_end_of_a_long_output_is_kept(tmp_path: Path) -> None:
    argv = script(tmp_path, "print('x' * 100000)\nprint('the end')\n")
    delivery = await deliver(target({"ship": argv}, output_limit=100))
    assert len(delivery.output) == 100
    assert delivery.output.endswith("the end\n")


async def test_the_targets_command_runs_dags_without_their_own(tmp_path: Path) -> None:
    argv = script(tmp_path, "import json, sys\nprint(json.load(sys.stdin)['dag_id'])\n")
    delivery = await deliver(target({}, command=argv), document(dag_id="audit"))
    assert (delivery.state, delivery.output) == ("success", "audit\n")


async def test_nothing_to_run_and_a_missing_program_are_undeliverable(tmp_path: Path) -> None:
    with pytest.raises(TargetError, match="DAG 'audit' has nothing to run here") as nothing:
        await target({}).deliver(document(dag_id="audit"), lambda _: None)
    assert not nothing.value.retryable
    missing = str(tmp_path / "no-such-program")
    with pytest.raises(TargetError, match="cannot start") as absent:
        await target({"ship": [missing]}).deliver(document(), lambda _: None)
    assert not absent.value.retryable


def test_the_document_is_plain_json() -> None:
    doc = document().to_json()
    assert json.loads(json.dumps(doc)) == doc
    assert doc["events"][0] == {
        "asset": "orders", "asset_event_id": 7, "event_id": 5,
        "payload": {"id": 5, "amount": 30}, "created_at": "2026-11-28T12:00:00+00:00",
        "trace_parent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"}
    assert (doc["version"], doc["dag_id"], doc["logical_date"]) == (1, "ship", None)
    assert document().idempotency_key == "ship/asset_triggered__000000000007"
