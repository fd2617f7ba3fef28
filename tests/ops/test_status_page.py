"""The status page in a real headless Chromium: it loads, and shows a live triggerer's numbers.

Chromium comes from Debian's packages (``apt-get install chromium``;
``.ci/run`` installs it); without it the test skips, or fails where ``CI``
is set. The page is loaded with
``--dump-dom`` after its script has fetched ``/status`` (a virtual time
budget lets it run), and a screenshot is taken the same way.
``SHAREDSTREAM_STATUS_SCREENSHOT=PATH`` keeps the screenshot there (how
``docs/images/status-page.png`` was made).
"""

from __future__ import annotations

import asyncio
import html
import json
import os
import re
import shutil
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from sharedstream.runtime.cli_output import TIME_FORMAT, time_text
from sharedstream.runtime.triggerer import Triggerer
from sharedstream.testing.memory_broker import MemoryBroker
from sharedstream.testing.runner import eventually_async
from tests.ops.conftest import OpsClient, start_triggerer
from tests.ops.held import BROKER, HELD

PAGE_DEFS = Path(__file__).with_name("page_defs.py")
BROWSER = shutil.which("chromium") or shutil.which("chromium-browser")


async def chromium(*args: str) -> str:
    """Run headless Chromium without blocking the loop the triggerer serves from."""
    assert BROWSER is not None
    process = await asyncio.create_subprocess_exec(
        BROWSER, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
        "--no-first-run", "--virtual-time-budget=4000", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode == 0, err.decode()[-2000:]
    return out.decode()


@pytest.fixture
async def page_triggerer(tmp_path: Path) -> AsyncIterator[tuple[Triggerer, OpsClient]]:
    if BROWSER is None:
        if os.environ.get("CI"):
            pytest.fail("Chromium is required where CI is set (.ci/run installs it)")
        pytest.skip("no chromium (apt-get install chromium)")
    MemoryBroker.forget(BROKER)
    HELD.set()
    triggerer, task = await start_triggerer(
        tmp_path, definitions=PAGE_DEFS, environ={"SHAREDSTREAM__API__BACKLOG_INTERVAL": "0.2"})
    assert triggerer.api is not None
    assert triggerer.api.address is not None
    try:
        yield triggerer, OpsClient("http://{}:{}".format(*triggerer.api.address))
    finally:
        HELD.set()
        triggerer.request_stop()
        assert await asyncio.wait_for(task, 30) == 0
        MemoryBroker.forget(BROKER)


def cells(dom: str, table: str) -> list[list[str]]:
    """The text of each body row of one table of the dumped page."""
    body = dom.split(f'<table id="{table}">', 1)[1].split("</table>", 1)[0]
    body = body.split("<tbody>", 1)[1]
    return [[html.unescape(re.sub(r"<[^>]+>", "", td)) for td in
             re.findall(r"<td[^>]*>(.*?)</td>", row)]
            for row in re.findall(r"<tr>(.*?)</tr>", body)]


async def test_the_page_shows_the_live_numbers(
    page_triggerer: tuple[Triggerer, OpsClient], tmp_path: Path
) -> None:
    triggerer, client = page_triggerer
    broker = MemoryBroker.named(BROKER)
    broker.produce("shop", [b'{"kind": "order"}', b'{"kind": "refund"}', b"not json",
                            b'{"kind": "order"}'])

    async def advanced() -> int:
        return triggerer.manager.totals.advanced
    await eventually_async(advanced, 4, what="the first records advanced")
    HELD.clear()
    broker.produce("shop", [b'{"kind": "order", "n": %d}' % i for i in range(30)])

    async def held_lag() -> int:
        status = json.loads((await client.get("/status")).text)
        (stream,) = status["streams"]
        return int(next(w["queued"] for w in stream["watchers"] if w["names"] == ["held/slow"]))

    async def lag_stable() -> bool:
        return await held_lag() == 29  # the 30th waits in its filter, the rest queued
    await eventually_async(lag_stable, True, what="the held watcher 29 behind")

    page = await client.get("/")
    assert page.status == 200
    assert page.headers["Content-Security-Policy"].startswith("default-src 'none'")
    dom = await chromium("--dump-dom", client.base + "/")
    assert '<body data-loaded="yes">' in dom
    assert '<span id="ready" class="badge ok" title="">ready</span>' in dom
    live = json.loads((await client.get("/status")).text)
    stored = re.search(r'id="total-events_stored"><b>(\d+)</b>', dom)
    assert stored is not None
    assert int(stored[1]) == live["totals"]["events_stored"]
    rows = {row[0]: row for row in cells(dom, "watchers")}
    # watchers, trigger, state, lag, seen, skipped, emitted, rejected, failed, stored, errors,
    # last
    assert rows["held/slow"][3:7] == ["29", "34", "0", "4"]
    assert rows["orders/json"][3:8] == ["0", "34", "1", "32", "1"]
    assert rows["orders/json"][11].startswith("undecodable json value: ")
    assert rows["everything/raw"][3:7] == ["0", "34", "0", "34"]
    (stream,) = cells(dom, "streams")
    assert stream[1] == "polling"
    assert int(stream[3]) >= 29  # outstanding: the held watcher's backlog
    # The memory broker cannot tell its backlog: n/a and why, never a 0.
    assert stream[6] == ("n/a (MemorySharedStreamProducer cannot tell its broker's backlog)")
    (letter,) = cells(dom, "dead_letters")
    assert "undecodable json value" in letter[4]
    runs = cells(dom, "dag_runs")
    assert len(runs) == 20  # the newest, as /status lists them
    assert [row[1] for row in runs] == [run["run_id"] for run in live["dag_runs"]]
    # Times in the one format the CLI prints too, in UTC and saying so, the refresh's included.
    assert [row[4] for row in runs] == [time_text(run["at"]) for run in live["dag_runs"]]
    (stored_letter,) = live["dead_letters"]
    assert letter[1] == time_text(stored_letter["at"])
    updated = re.search(r'<span id="updated">updated ([^<]*)</span>', dom)
    assert updated is not None
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", updated[1]), updated[1]
    assert abs(datetime.strptime(updated[1], TIME_FORMAT).replace(tzinfo=UTC)
               - datetime.now(UTC)) < timedelta(minutes=2)

    shot = Path(os.environ.get("SHAREDSTREAM_STATUS_SCREENSHOT") or tmp_path / "status.png")
    await chromium("--window-size=1280,860", f"--screenshot={shot}", client.base + "/")
    header = await asyncio.to_thread(shot.read_bytes)
    assert header[:8] == b"\x89PNG\r\n\x1a\n"
