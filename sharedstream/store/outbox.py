"""The dispatch half of the store contract: queued DAG runs as an outbox.

A queued DAG run *is* the message to deliver: nothing is copied to a second
queue. A triggerer's dispatcher claims runs from ``dag_runs``, hands each to
the target its DAG names (an Apache Airflow, a webhook, a local command) and
records what the target answered, all through the methods of
:class:`OutboxStore`, which every :class:`~sharedstream.store.base.MetadataStore`
implements.

Terms:

* **state** - one of :data:`RUN_STATES`. A run is created ``queued``; a
  dispatcher's claim makes it ``dispatching`` (an attempt is under way);
  the target's answer makes it ``dispatched`` (the target has it),
  ``running``, ``success`` or ``failed``; a delivery that failed in a way
  worth retrying puts it back to ``queued`` with a ``next_attempt_at``;
  one that cannot succeed, or the last of the retry budget, makes it
  ``undeliverable``. :data:`FINISHED_STATES` are final (only a person's
  ``runs retry`` or ``runs mark`` changes them).
* **claim** - ``claimed_by`` names the triggerer that owns a run while it is
  ``dispatching``, ``dispatched`` or ``running`` (it delivers it, then
  follows it at the target). That triggerer's heartbeat is the claim's
  lease, as for standalone triggers: a run claimed by a triggerer whose last
  heartbeat is older than the health-check threshold is taken over. A
  ``dispatching`` run taken over is *recovered*: the attempt before may or
  may not have reached the target, so the next one must find out (the
  target is told the run's identity, ``dag_id`` + ``run_id``, and counts a
  run it already has as delivered).
* **attempt** - each claim for delivery is one numbered attempt, kept with
  its outcome, a one-line detail and (a local command's) bounded output.

Contracts every backend keeps:

1. A run is claimed by at most one triggerer at a time: claims are one
   transaction (SQLite: the single writer; PostgreSQL: ``FOR UPDATE SKIP
   LOCKED``, so concurrent claimers skip each other's rows, never wait).
2. Claims hand out runs in id order within the DAGs asked for, never those
   of a paused DAG, never one whose ``next_attempt_at`` is in the future.
3. A result is applied only while the run is still claimed by the
   triggerer reporting it (a fence): a triggerer that was taken for dead
   and lost its runs cannot overwrite what the new owner records.
4. Each mutation is one transaction; on failure it raises
   :class:`~sharedstream.store.base.StoreWriteError` and changes nothing.
5. The write path (``write_events``, ``queue_timed_runs``) is untouched by
   dispatching: it only ever inserts ``queued`` runs; acks wait for it
   alone.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

__all__ = [
    "ATTEMPT_OUTPUT_LIMIT",
    "FINISHED_STATES",
    "RUN_STATES",
    "UNFINISHED_STATES",
    "AttemptRow",
    "ClaimedRun",
    "DispatchResult",
    "OutboxStore",
    "PruneResult",
    "RunEvent",
]

RUN_STATES = ("queued", "dispatching", "dispatched", "running", "success", "failed",
              "undeliverable")
"""Every state of a DAG run, in the order a run goes through them."""

FINISHED_STATES = frozenset({"success", "failed", "undeliverable"})
"""The final states: nothing more happens to such a run unless a person says so."""

UNFINISHED_STATES = frozenset(RUN_STATES) - FINISHED_STATES
"""Every other state: the run still needs its dispatcher."""

ATTEMPT_OUTPUT_LIMIT = 64 * 1024
"""Most characters of a local command's output an attempt keeps (its end, the part that
says why it failed)."""


@dataclass(frozen=True, slots=True)
class RunEvent:
    """One asset event a run consumed, with the stored trigger event behind it.

    ``payload`` is the stored trigger event's payload as the runtime packed
    it (the store never looks inside).
    """

    asset_event_id: int
    asset: str
    event_id: int
    payload: bytes
    created_at: datetime
    trace_parent: str | None


@dataclass(frozen=True, slots=True)
class ClaimedRun:
    """A run a dispatcher owns now, with everything a target is told about it.

    ``attempt`` is the number of the attempt this claim starts (1 for the
    first); a run claimed for following (:meth:`OutboxStore.follow_runs`)
    keeps the number of its last attempt. ``tries`` counts the attempts of
    the current retry budget (``attempt`` less those made before the last
    ``runs retry``). ``recovered`` is true when the
    previous attempt's outcome is unknown (its triggerer died while it was
    under way). ``events`` are in asset event id order; ``conf`` is a manual
    run's configuration (``None`` for the others).
    """

    id: int
    dag_id: str
    run_id: str
    run_type: str
    state: str
    attempt: int
    tries: int
    target: str | None
    queued_at: datetime
    logical_date: datetime | None
    data_interval_start: datetime | None
    data_interval_end: datetime | None
    run_after: datetime | None
    conf: dict[str, Any] | None
    trace_parent: str | None
    external_id: str | None
    external_url: str | None
    recovered: bool = False
    events: tuple[RunEvent, ...] = ()


@dataclass(frozen=True, slots=True)
class DispatchResult:
    """What became of one claimed run, to record with :meth:`OutboxStore.record_dispatch`.

    ``state`` is the run's new state (any of :data:`RUN_STATES` but
    ``dispatching``): ``queued`` with ``next_attempt_at`` for a retry later.
    ``attempt`` names the attempt it ends, or ``None`` for what following a
    dispatched run learnt (its attempt is over already). ``detail`` is one
    line (an error, or the target's answer); ``output`` a local command's
    captured output, cut to :data:`ATTEMPT_OUTPUT_LIMIT` characters by the
    store. ``external_id``/``external_url``: the target's own name of the
    run, when it gives one (``None`` keeps what is stored).
    """

    run: int
    state: str
    attempt: int | None = None
    detail: str | None = None
    next_attempt_at: datetime | None = None
    external_id: str | None = None
    external_url: str | None = None
    output: str | None = None


@dataclass(frozen=True, slots=True)
class AttemptRow:
    """One attempt to deliver a run: who made it, when, and what came of it.

    ``outcome`` is the state the attempt led to, ``"unknown"`` when its
    triggerer died before recording it, or ``None`` while it is under way.
    """

    run: int
    attempt: int
    triggerer_id: str | None
    target: str | None
    started_at: datetime
    ended_at: datetime | None
    outcome: str | None
    detail: str | None
    output: str | None


@dataclass(frozen=True, slots=True)
class PruneResult:
    """What :meth:`OutboxStore.prune` deleted, by table."""

    dag_runs: int = 0
    trigger_events: int = 0
    asset_events: int = 0
    dead_letters: int = 0
    triggerers: int = 0
    failure_counts: int = 0
    """Raw events' failure counts (``raw_event_failures``) not updated since the cutoff."""
    replays: int = 0
    """Replays that ended (done, cancelled, failed) before the cutoff."""
    more: bool = False
    """Whether a kind hit the limit: call again for the rest."""

    def total(self) -> int:
        """Rows deleted in all."""
        return (self.dag_runs + self.trigger_events + self.asset_events + self.dead_letters
                + self.triggerers + self.failure_counts + self.replays)


class OutboxStore(Protocol):
    """The dispatch methods of a metadata store (see the module docstring for the contracts)."""

    def claim_runs(
        self, triggerer_id: str, targets: Mapping[str, str], limit: int, threshold: float
    ) -> list[ClaimedRun]:
        """Claim up to ``limit`` runs due for delivery, for ``triggerer_id``, in one transaction.

        ``targets`` maps each DAG the caller can deliver to the name of its
        target; only runs of those DAGs are considered, and the claimed run
        records its target. Due: ``queued`` with no ``next_attempt_at`` or
        one that has passed; or, under a claim whose triggerer's heartbeat
        is more than ``threshold`` seconds old (or gone), a run whose last
        attempt has no outcome yet (``dispatching``, or ``running`` in place
        on the local target) - *recovered* (that attempt is closed as
        ``unknown``). A run a target accepted (its attempt ended
        ``dispatched`` or ``running``) is followed, never delivered again.
        Never a run of a paused DAG. Each claimed run becomes
        ``dispatching``, claimed by ``triggerer_id``, its attempt count
        one higher, with a new attempt row. Returns them in id order, with
        their events.
        """
        ...

    def follow_runs(
        self, triggerer_id: str, targets: Mapping[str, str], limit: int, threshold: float
    ) -> list[ClaimedRun]:
        """Runs ``dispatched`` or ``running`` to ask their target about, oldest update first.

        Those ``triggerer_id`` claims, and those whose claimer's heartbeat is
        more than ``threshold`` seconds old (claimed for ``triggerer_id``
        in the same transaction), of the DAGs in ``targets``; at most
        ``limit``, without their events.
        """
        ...

    def record_dispatch(self, triggerer_id: str, results: Sequence[DispatchResult]) -> int:
        """Apply results of ``triggerer_id``'s attempts and follow-ups in one transaction.

        Each is applied only if its run is still claimed by
        ``triggerer_id`` (a fence); a final state or ``queued`` releases
        the claim. Sets ``dispatched_at`` the first time a run reaches the
        target and ``ended_at`` when it finishes; closes the attempt row it
        names. Returns how many results were applied.
        """
        ...

    def unclaim_runs(self, triggerer_id: str, runs: Sequence[tuple[int, int]]) -> int:
        """Hand back claimed runs whose attempt never started: ``(run id, attempt)`` pairs.

        Each run still ``dispatching`` under ``triggerer_id``'s claim, with
        that attempt open, goes back to ``queued`` as if it had not been
        claimed: the attempt row goes, the attempt count steps back. For the
        runs a dispatcher claimed ahead of a free slot and did not start
        before it stopped. Returns how many were handed back.
        """
        ...

    def release_runs(self, triggerer_id: str) -> None:
        """Give up following the ``dispatched``/``running`` runs ``triggerer_id`` claims.

        A graceful stop: another triggerer follows them at once. Runs still
        ``dispatching`` keep their claim (their outcome is unknown: they are
        recovered after the threshold, as after a crash). Idempotent.
        """
        ...

    def get_run(self, dag_id: str, run_id: str) -> ClaimedRun | None:
        """One run with its events, whatever its state, or ``None``."""
        ...

    def run_attempts(self, run: int) -> list[AttemptRow]:
        """The attempts of the run with row id ``run``, in order."""
        ...

    def retry_runs(self, runs: Sequence[int]) -> int:
        """Queue finished runs again (a person's ``runs retry``), now, with a new retry budget.

        Only runs in :data:`FINISHED_STATES` change; their attempt count
        starts over (their attempts are kept). Returns how many changed.
        """
        ...

    def mark_runs(self, runs: Sequence[int], state: str, note: str) -> int:
        """Set runs that are not ``dispatching`` to ``success`` or ``failed`` (a person's word).

        Releases their claims and records ``note`` as their last detail.
        Returns how many changed. :class:`~sharedstream.store.base.StoreError`
        for another state.
        """
        ...

    def queue_manual_run(self, dag_id: str, run_id: str, conf: Mapping[str, Any]) -> bool:
        """Queue a manual run of a known DAG with ``conf``; ``False`` if ``run_id`` exists.

        :class:`~sharedstream.store.base.StoreError` for an unknown DAG.
        """
        ...

    def set_dag_paused(self, dag_id: str, paused: bool) -> bool:
        """Pause or unpause a DAG's dispatching; ``False`` when no such DAG is stored.

        A paused DAG's runs are still queued (nothing is lost); none is
        claimed until it is unpaused.
        """
        ...

    def run_counts(self) -> dict[tuple[str, str, str], int]:
        """How many runs there are per ``(dag_id, target or "", state)``."""
        ...

    def prune(self, before: datetime, limit: int = 10_000) -> PruneResult:
        """Delete what finished before ``before``, in one transaction; returns what went.

        Runs in a final state that ended (or, never dispatched, were created)
        before it, with their attempts; trigger events (and their asset
        events) created before it that no remaining run consumed and no DAG
        queue holds; dead letters created before it; triggerers whose last
        heartbeat is before it; raw events' failure counts last updated
        before it; replays that ended before it. Never an unfinished run,
        an active replay, or an event one
        needs. At most ``limit`` rows of each kind, oldest first, so one call
        holds the write lock briefly: call again while the result says
        ``more``. A pruned event's idempotency key goes with it: a message
        redelivered after that would be stored anew, so keep more than the
        broker's longest redelivery horizon.
        """
        ...
