"""A real SQLite store with runs queued, a scripted target, and a dispatcher over them."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from sharedstream.dispatch.dispatcher import Db, Dispatcher, DispatchSettings, Route
from sharedstream.dispatch.document import RunDocument
from sharedstream.dispatch.target import (
    Delivery,
    Target,
    TargetContext,
    TargetError,
    check_options,
)
from sharedstream.runtime.serde import pack_event_payload, unpack_event_payload
from sharedstream.store import (
    DagSpec,
    MetadataStore,
    PendingEvent,
    SqliteStore,
    TriggerSpec,
    WatcherSpec,
)

Answer = Delivery | TargetError | Callable[[], Any]


class ScriptedTarget(Target):
    """Answers each delivery from a script (per run id, else the default), and records it.

    A script entry is a list of answers consumed in order: a :class:`Delivery`
    to return, a :class:`TargetError` to raise, or a coroutine function to
    await (it may hang). ``status_of`` answers follow-ups.
    """

    follows = True

    def __init__(self, name: str, settings: dict[str, Any]) -> None:
        super().__init__(name, settings, TargetContext({}, lambda _: None))  # type: ignore[arg-type,return-value]
        self.script: dict[str, list[Answer]] = {}
        self.default: Answer = Delivery("dispatched", external_id="x")
        self.delivered: list[RunDocument] = []
        self.status_of: dict[str, Delivery | None] = {}
        self.asked: list[str] = []
        self.busy = 0
        self.most_busy = 0
        self.opened = self.closed = 0

    async def open(self) -> None:
        self.opened += 1

    async def aclose(self) -> None:
        self.closed += 1

    async def deliver(self, run: RunDocument, progress: Callable[[str], None]) -> Delivery:
        self.delivered.append(run)
        self.busy += 1
        self.most_busy = max(self.most_busy, self.busy)
        try:
            queue = self.script.get(run.run_id)
            answer = queue.pop(0) if queue else self.default
            if isinstance(answer, TargetError):
                raise answer
            if isinstance(answer, Delivery):
                await asyncio.sleep(0)
                return answer
            result = await answer()
            assert isinstance(result, Delivery)
            return result
        finally:
            self.busy -= 1

    async def status(self, run: RunDocument) -> Delivery | None:
        self.asked.append(run.run_id)
        return self.status_of.get(run.run_id)


def settings(**overrides: Any) -> dict[str, Any]:
    """Every option of a target, with test-sized backoffs."""
    return check_options(ScriptedTarget, {"retry_backoff_initial": 0.05,
                                          "retry_backoff_max": 0.2, **overrides}, "test")


class World:
    """A store with DAG ``d`` on asset ``a``, a trigger to fire, and dispatchers to run."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.store: MetadataStore = SqliteStore(path)
        self.store.migrate()
        ids = self.store.sync_definitions(
            [TriggerSpec("fp", "pkg.T", b"kw")], [WatcherSpec("a", "w", "fp")],
            [DagSpec("d", {"asset": "a"}), DagSpec("e", {"asset": "a"})])
        self.trigger = ids["fp"]
        self.store.heartbeat("t1", "host", 1)
        self.thread = ThreadPoolExecutor(max_workers=1)
        self._fired = 0

    def fire(self, count: int) -> None:
        """``count`` events, each making one run of ``d`` (and one of ``e``)."""
        batch = [PendingEvent(self.trigger, f"k{self._fired + n}",
                              pack_event_payload({"n": self._fired + n}))
                 for n in range(count)]
        self._fired += count
        self.store.write_events(batch)

    async def db(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self.thread, fn, *args)

    def dispatcher(self, target: Target, *, dags: tuple[str, ...] = ("d",),
                   triggerer: str = "t1", db: Db | None = None, **overrides: Any) -> Dispatcher:
        config = {"poll_interval": 0.05, "follow_interval": 0.05, "flush_interval": 0.005,
                  "threshold": 30.0, **overrides}
        return Dispatcher(triggerer_id=triggerer,
                          routes={dag: Route(target.name, target) for dag in dags},
                          store=self.store, db=db or self.db, payload_of=unpack_event_payload,
                          settings=DispatchSettings(**config))

    def states(self, dag: str = "d") -> list[str]:
        return [r.state for r in reversed(self.store.list_runs(dag_id=dag, limit=10_000))]

    def close(self) -> None:
        self.thread.shutdown(wait=True)
        self.store.close()


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    found = World(tmp_path / "meta.db")
    yield found
    found.close()


@contextlib.asynccontextmanager
async def running(dispatcher: Dispatcher) -> AsyncIterator[asyncio.Task[None]]:
    """The dispatcher opened and running; stopped gracefully (then cancelled) on exit."""
    await dispatcher.open()
    task = asyncio.create_task(dispatcher.run())
    try:
        yield task
    finally:
        dispatcher.begin_stop()
        done, _ = await asyncio.wait({task}, timeout=5)
        if not done:
            task.cancel()
            await asyncio.wait({task})
        if not task.cancelled():
            task.result()  # the dispatcher's own failure fails the test
