"""What the operations modules read of a running triggerer, and the check they report.

The endpoint (:mod:`~sharedstream.runtime.api`), its views
(:mod:`~sharedstream.runtime.ops_view`, :mod:`~sharedstream.runtime.ops_metrics`,
:mod:`~sharedstream.runtime.ops_dispatch`) and the progress lines
(:mod:`~sharedstream.runtime.progress_log`) are started by the triggerer
and read it. They know it only as an :class:`ObservedTriggerer`, declared
here, so the triggerer imports them and none of them imports the
triggerer: :class:`~sharedstream.runtime.triggerer.Triggerer` is the one
implementation, checked where it hands itself over.

Contract: every member is read on the triggerer's event loop, and nothing
here changes the triggerer's state; :meth:`ObservedTriggerer.db` is the
one way to touch the store's connection (it runs on the store's thread).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from sharedstream.engine.manager import SharedStreamManager
from sharedstream.runtime.config import Config
from sharedstream.runtime.dispatch_setup import DispatchService
from sharedstream.runtime.persist import PersistGate
from sharedstream.runtime.replay_loop import ReplayLoop
from sharedstream.runtime.supervisor import Progress
from sharedstream.store import MetadataStore

__all__ = ["Check", "ObservedTriggerer"]

T = TypeVar("T")


@dataclass(frozen=True)
class Check:
    """One readiness check: its name, whether it holds, and why not."""

    name: str
    ok: bool
    detail: str


class ObservedTriggerer(Protocol):
    """A running triggerer as the operations modules read it (see the module docstring)."""

    @property
    def config(self) -> Config:
        """Its configuration (``[api]``, ``[store]``, ...)."""

    @property
    def store(self) -> MetadataStore:
        """The metadata store; raises ``SharedStreamError`` before the triggerer opened it."""

    @property
    def gate(self) -> PersistGate:
        """The persistence gate (queued writes, duplicates, whether the store is failing)."""

    @property
    def manager(self) -> SharedStreamManager:
        """The engine: its streams, totals and intake."""

    @property
    def progress(self) -> Progress:
        """What its supervised triggers did (running, refused, unrunnable, ...)."""

    @property
    def dispatch(self) -> DispatchService | None:
        """The dispatch service (``[dispatch] enabled``), else ``None``."""

    @property
    def triggerer_id(self) -> str:
        """Its id in the store (``host-pid-suffix``)."""

    @property
    def runs_queued(self) -> int:
        """DAG runs it queued so far (asset-triggered and scheduled)."""

    @property
    def replays(self) -> ReplayLoop | None:
        """Its replay loop (the replay it runs now; wake it), ``None`` without shared streams."""

    async def db(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(*args)`` on the store's single database thread."""
