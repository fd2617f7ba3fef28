"""The instruction-count benchmark's own parts (``benchmarks/instructions.py``), no valgrind.

Its ``bytes`` watchers must fire exactly the events the headline's ``json``
watchers fire (only the decoding they skip may differ), its ``none``
watchers none at all after the same search, and it must refuse
to run rather than measure the ``json`` watchers twice if the headline's
watcher text changes. Its reader of callgrind's dumps must give each thread
its own count, the main thread being thread 1.
"""

from __future__ import annotations

import asyncio
import importlib
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(scope="module")
def bench() -> Iterator[ModuleType]:
    sys.path.insert(0, str(BENCHMARKS))
    try:
        yield importlib.import_module("instructions")
    finally:
        sys.path.remove(str(BENCHMARKS))


def _watcher_class(text: str, tmp_path: Path, name: str) -> Any:
    path = tmp_path / f"{name}.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.BucketWatcher


async def _fired(watcher: Any, values: list[bytes]) -> list[Any]:
    async def stream() -> AsyncIterator[bytes]:
        for value in values:
            yield value

    return [event.payload async for event in watcher.filter_shared_stream(stream())]


def test_the_bytes_watchers_fire_what_the_json_ones_fire(bench: ModuleType,
                                                           tmp_path: Path) -> None:
    from _e2e import message_body  # noqa: PLC0415 - beside the benchmark, on its path

    values = [message_body(index).encode() for index in range(250)]
    fired = {}
    for filter_ in ("json", "bytes"):
        watcher_class = _watcher_class(bench.watchers_text(filter_), tmp_path, f"w_{filter_}")
        fired[filter_] = [
            asyncio.run(_fired(watcher_class(topics=["t"], kafka_config_id="k", bucket=j % 10,
                                             watcher=j), values))
            for j in range(12)
        ]
    assert "json.loads(value)" in bench.watchers_text("json")
    assert bench.watchers_text("bytes") != bench.watchers_text("json")
    assert fired["bytes"] == fired["json"]
    assert [len(events) for events in fired["json"]] == [25] * 12
    assert fired["json"][3][0] == {"id": 3, "watcher": 3}


def test_the_none_watchers_search_as_the_bytes_ones_and_fire_nothing(
        bench: ModuleType, tmp_path: Path) -> None:
    from _e2e import message_body  # noqa: PLC0415 - beside the benchmark, on its path

    values = [message_body(index).encode() for index in range(250)]
    text = bench.watchers_text("none")
    assert text.count(".find(") == bench.watchers_text("bytes").count(".find(") == 1
    watcher_class = _watcher_class(text, tmp_path, "w_none")
    for j in range(12):
        watcher = watcher_class(topics=["t"], kafka_config_id="k", bucket=j % 10, watcher=j)
        assert asyncio.run(_fired(watcher, values)) == []


def test_a_changed_headline_watcher_is_refused_not_measured_as_json(
        bench: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bench, "WATCHERS", bench.WATCHERS.replace("json.loads", "loads"))
    with pytest.raises(RuntimeError, match="no longer decodes"):
        bench.watchers_text("bytes")


def test_each_thread_gets_its_own_count_from_the_dumps(bench: ModuleType,
                                                       tmp_path: Path) -> None:
    out = tmp_path / "callgrind.out"
    out.write_text("")  # the empty file callgrind leaves under the plain name
    (tmp_path / "callgrind.out.1-01").write_text("events: Ir\nsummary: 900\ntotals: 900\n")
    (tmp_path / "callgrind.out.1-02").write_text("events: Ir\nsummary: 70\ntotals: 70\n")
    (tmp_path / "callgrind.out.1-03").write_text("events: Ir\ntotals: 5\n")
    (tmp_path / "other.out.1-01").write_text("totals: 123456\n")
    assert bench.thread_totals(out) == {1: 900, 2: 70, 3: 5}
