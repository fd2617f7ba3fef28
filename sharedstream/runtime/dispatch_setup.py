"""Where each DAG's runs go, decided once at start-up, and the dispatcher built from it.

:func:`dispatch_plan` reads the definitions file's DAGs and the
configuration's targets and decides, per DAG (the rule ``docs/dispatch.md``
states):

1. ``Dag(target="name")``: that target (a ``[targets.<name>]``, or
   ``local``); an unknown name is an error naming the DAG;
2. else ``Dag(run=...)``: the built-in ``local`` target, which runs it;
3. else ``[dispatch] default_target``, when set;
4. else nowhere: its runs wait in the store.

A DAG whose target is a ``command`` target with nothing to run (no
``run=``, no ``command``) waits too, said once at start-up. Everything
that is wrong is found here, before the triggerer runs anything, and said
in one line (:class:`~sharedstream.engine.errors.SharedStreamError`).
"""

from __future__ import annotations

import asyncio
import difflib
import json
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from sharedstream.connections import get_connection
from sharedstream.dispatch.dispatcher import Dispatcher, DispatchSettings, Route
from sharedstream.dispatch.target import (
    LOCAL_TARGET,
    Target,
    TargetConfigError,
    TargetContext,
    check_options,
    target_type,
)
from sharedstream.engine.errors import SharedStreamError
from sharedstream.engine.keyvalue_log import key_value_logger
from sharedstream.runtime.config import Config
from sharedstream.runtime.config_targets import TargetConfig
from sharedstream.runtime.definitions import Definitions
from sharedstream.runtime.serde import unpack_event_payload
from sharedstream.store import MetadataStore, OutboxStore

__all__ = ["DagRoute", "DispatchPlan", "DispatchService", "build_dispatcher", "dispatch_plan"]

log = key_value_logger("sharedstream.runtime")


@dataclass(frozen=True)
class DagRoute:
    """One DAG's target, and the options the DAG overrides (``target_options``)."""

    target: TargetConfig
    overrides: dict[str, Any]


@dataclass
class DispatchPlan:
    """Each DAG's route, and why the others' runs wait in the store."""

    routes: dict[str, DagRoute] = field(default_factory=dict)
    waiting: dict[str, str] = field(default_factory=dict)

    def stored_target(self, dag_id: str) -> dict[str, Any] | None:
        """What the store keeps of a DAG's target (``dags list`` shows it), or ``None``."""
        route = self.routes.get(dag_id)
        if route is None:
            return None
        return {"name": route.target.name, "type": route.target.type,
                "options": route.overrides}


def dispatch_plan(definitions: Definitions, config: Config) -> DispatchPlan:
    """Route every DAG of ``definitions`` (see the module docstring); one-line errors."""
    plan = DispatchPlan()
    default = config.dispatch.default_target
    if default and config.target(default) is None:
        raise SharedStreamError(
            f"[dispatch] default_target = {default!r}: {_no_target(default, config)}")
    for dag_id, dag in definitions.dags.items():
        name = dag.target or (LOCAL_TARGET if dag.run is not None else default)
        if not name:
            plan.waiting[dag_id] = ("no target: give it run= or target=, or set [dispatch] "
                                    "default_target")
            continue
        target = config.target(name)
        if target is None:
            raise SharedStreamError(f"Dag {dag_id!r}: target={name!r}: {_no_target(name, config)}")
        try:
            overrides = check_options(target_type(target.type), dag.target_options,
                                      f"Dag {dag_id!r} target_options", dag_only=True)
        except TargetConfigError as exc:
            raise SharedStreamError(str(exc)) from None
        if (target.type == "command" and dag.run is None
                and not {**target.settings, **overrides}.get("command")):
            plan.waiting[dag_id] = (f"its target {name!r} has nothing to run: give it run= (or "
                                    f"the target a command)")
            continue
        plan.routes[dag_id] = DagRoute(target, overrides)
    return plan


def _no_target(name: str, config: Config) -> str:
    known = sorted({LOCAL_TARGET, *config.targets})
    near = difflib.get_close_matches(name, known, n=1)
    hint = f"did you mean {near[0]!r}? " if near else ""
    return f"no such target; {hint}targets: {', '.join(known)} (see [targets.<name>])"


def build_dispatcher(
    plan: DispatchPlan, definitions: Definitions, config: Config, *, store: OutboxStore,
    db: Callable[..., Any], triggerer_id: str, threshold: float,
) -> Dispatcher:
    """The dispatcher of ``plan``: one target instance per target and set of DAG overrides.

    Instances of one target share its name, so their deliveries share its
    ``max_concurrency``. Building a target touches nothing outside (it opens
    in :meth:`Dispatcher.open`); a type that cannot be loaded raises here.
    """
    runnables = {dag_id: dag.run for dag_id, dag in definitions.dags.items()
                 if dag.run is not None}
    context = TargetContext(runnables=runnables, connection=get_connection)
    instances: dict[tuple[str, str], Target] = {}
    routes: dict[str, Route] = {}
    for dag_id, route in plan.routes.items():
        key = (route.target.name, json.dumps(route.overrides, sort_keys=True, default=str))
        if key not in instances:
            try:
                cls = target_type(route.target.type)
            except TargetConfigError as exc:
                raise SharedStreamError(str(exc)) from None
            instances[key] = cls(route.target.name, {**route.target.settings, **route.overrides},
                                 context)
        routes[dag_id] = Route(route.target.name, instances[key])
    dconf = config.dispatch
    settings = DispatchSettings(poll_interval=dconf.poll_interval,
                                follow_interval=dconf.follow_interval,
                                claim_batch=dconf.claim_batch, claim_ahead=dconf.claim_ahead,
                                threshold=threshold)
    return Dispatcher(triggerer_id=triggerer_id, routes=routes, store=store, db=db,
                      payload_of=unpack_event_payload, settings=settings)


class DispatchService:
    """The triggerer's dispatcher, with a store connection and a database thread of its own.

    Built in the triggerer's constructor (so a bad target stops it before
    anything runs); :meth:`start` opens the store and the targets and starts
    the dispatcher as a task of the triggerer's task group; :meth:`wake` is
    what the persistence gate's thread calls when it stored new runs;
    :meth:`stop` ends it within a budget; :meth:`close` always runs last.
    Nothing here shares the gate's connection or thread: dispatching cannot
    hold up the broker's acks.
    """

    def __init__(self, config: Config, definitions: Definitions, plan: DispatchPlan,
                 triggerer_id: str) -> None:
        self._config = config
        self._definitions = definitions
        self.plan = plan
        self._triggerer_id = triggerer_id
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sharedstream-dispatch")
        self._store: MetadataStore | None = None
        self.dispatcher: Dispatcher | None = None
        self._task: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    async def _db(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._thread, fn, *args)

    async def start(self, tasks: asyncio.TaskGroup, threshold: float) -> None:
        """Open the store and every target, then run the dispatcher in ``tasks``.

        Raises (one line) when a target cannot open: the triggerer stops.
        """
        self._loop = asyncio.get_running_loop()
        self._store = await self._db(self._config.store.open_store)
        dispatcher = build_dispatcher(self.plan, self._definitions, self._config,
                                      store=self._store, db=self._db,
                                      triggerer_id=self._triggerer_id, threshold=threshold)
        await dispatcher.open()
        self.dispatcher = dispatcher
        self._task = tasks.create_task(self._supervise(dispatcher), name="sharedstream-dispatcher")
        log.info("dispatching DAG runs", targets=",".join(sorted(dispatcher.targets)),
                 dags=len(self.plan.routes))

    async def _supervise(self, dispatcher: Dispatcher) -> None:
        """Run the dispatcher; a failure of its own is logged and it starts again, with backoff.

        Never raises (but cancellation): dispatching must not take ingestion
        down. What it had not recorded is kept, or recovered by the next claim.
        """
        delay = 1.0
        while True:
            try:
                await dispatcher.run()
            except Exception:
                log.exception("the dispatcher failed; starting it again", retry_in_s=delay)
            else:
                return
            await asyncio.sleep(delay)
            delay = min(delay * 2, 60.0)
            try:
                await dispatcher.open()
            except Exception:  # its targets could not open: tried again after the next delay
                log.exception("the dispatcher's targets could not open again")

    def wake_threadsafe(self) -> None:
        """Look for runs now; callable from any thread (the gate's, after a write)."""
        loop, dispatcher = self._loop, self.dispatcher
        if loop is not None and dispatcher is not None and not loop.is_closed():
            loop.call_soon_threadsafe(dispatcher.wake)

    async def stop(self, within: float) -> None:
        """Stop claiming, let deliveries under way finish for ``within`` seconds, hand over."""
        dispatcher, task = self.dispatcher, self._task
        if dispatcher is None or task is None:
            return
        dispatcher.begin_stop()
        done, _ = await asyncio.wait({task}, timeout=within)
        if not done:
            log.warning("stopping: deliveries still under way; their runs are recovered by the "
                        "next claim", in_flight=dispatcher.in_flight)
            task.cancel()
            await asyncio.wait({task})
        await dispatcher.release()

    async def close(self) -> None:
        """Close the store and the thread (after :meth:`stop`, or when start-up failed)."""
        if self._store is not None:
            await self._db(self._store.close)
            self._store = None
        self._thread.shutdown(wait=True)
