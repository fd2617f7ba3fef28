"""``[store] retention`` and ``db prune``: what is done goes, in small bites; nothing else."""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from sharedstream.runtime.cli import main
from sharedstream.runtime.retention import Retention
from sharedstream.store import DispatchResult
from tests.dispatch.conftest import World
from tests.engine.harness import eventually


def finish(world: World, count: int) -> None:
    """``count`` runs of ``d`` (and as many of ``e``, left queued); those of ``d`` succeed."""
    world.fire(count)
    claimed = world.store.claim_runs("t1", {"d": "local"}, count, 30.0)
    world.store.record_dispatch("t1", [DispatchResult(r.id, "success", attempt=1)
                                       for r in claimed])


async def test_the_triggerers_pass_prunes_finished_runs_and_keeps_the_rest(
        tmp_path: Path) -> None:
    world = World(tmp_path / "meta.db")
    finish(world, 25)
    thread = ThreadPoolExecutor(max_workers=1)

    async def db(fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(thread, fn, *args)

    retention = Retention(lambda: world.store, db, timedelta(seconds=-1), interval=0.05,
                          first_delay=0)
    task = asyncio.create_task(retention.run())
    try:
        await eventually(lambda: world.states() == [], within=10)
    finally:
        task.cancel()
        await asyncio.wait({task})
        thread.shutdown()
    assert world.states("e") == ["queued"] * 25  # unfinished: kept, with their events
    assert world.store.counts()["trigger_events"] == 25
    world.close()


def test_db_prune_by_hand(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["init"]) == 0
    world = World(tmp_path / "sharedstream.db")
    finish(world, 3)
    world.close()
    capsys.readouterr()
    assert main(["db", "prune", "--older-than", "1d"]) == 0
    assert capsys.readouterr().out.endswith(": 0 runs, 0 trigger events, 0 asset events, "
                                            "0 dead letters, 0 triggerers, 0 replays\n")
    time.sleep(1.1)
    assert main(["db", "prune", "--older-than", "1s"]) == 0  # they finished over a second ago
    # the three finished runs go; their events stay, still needed by e's queued runs
    assert ": 3 runs, 0 trigger events, 0 asset events, 0 dead letters, 1 triggerers" in (
        capsys.readouterr().out)
    with pytest.raises(SystemExit) as bad:
        main(["db", "prune", "--older-than", "soon"])
    assert bad.value.code == 2
    assert "expected an age such as 30d" in capsys.readouterr().err
