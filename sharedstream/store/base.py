"""The metadata store contract, shared by every backend (SQLite and PostgreSQL).

Data model, in the words every backend uses:

* **trigger** - one registered trigger instance, identified by its
  *fingerprint* (stable across restarts, computed by the caller from the
  classpath and kwargs). The kwargs blob is already serialized and encrypted
  by the caller; a store keeps and returns it byte for byte and never looks
  inside. ``state`` is one of :data:`TRIGGER_STATES`.
* **watcher** - binds a trigger to an asset under a name: every stored event
  of the trigger becomes one asset event of that asset.
* **DAG** - a ``dag_id`` and a schedule tree over asset names (see
  :class:`Schedule`). An asset event of an asset the schedule mentions joins
  the DAG's *pending queue*; when the tree is satisfied by the assets in the
  queue, one queued DAG run is created that consumes the whole queue.
* **trigger event** - a stored :class:`PendingEvent`. A non-``None``
  ``idem_key`` is unique across the whole store: a second event with the same
  key is a *duplicate* and leaves no trace at all (no asset event, no run), so
  the caller must put into the key everything that distinguishes two genuine
  events (trigger fingerprint, broker message identity, position of the event
  among those the filter derived from that message).
* **message fingerprint** - a stored event may keep the fingerprint of the
  broker message it came from (see
  ``SharedStreamProducer.raw_event_fingerprint``): what tells that message
  from a later one that got the same name, as when a recreated topic reuses
  offsets. An event whose key is stored already is a duplicate *unless*
  both it and the stored event have a fingerprint and the two differ: then
  it is a new message that reused the name, and it is stored under the
  key ``f"{idem_key}#{fingerprint}"`` (itself idempotent: its redelivery is
  a duplicate) and reported in :attr:`WriteResult.renamed`. Events stored
  before fingerprints existed have none, so anything matching their keys
  stays a duplicate. Only keys stored before the batch are compared: a key
  repeated within one batch is a duplicate whatever its fingerprint.
* **trace context** - a stored event keeps the W3C ``traceparent`` value
  (``00-<trace id>-<span id>-<flags>``) of the span that processed it, and
  an asset-triggered run keeps that of the event that completed its
  condition. The store keeps the text as given (``None`` when there is
  none) and never parses it.

Contracts every backend keeps:

1. Every mutation is one transaction: it is entirely visible after it
   returns, or (when it raises) not at all.
2. :meth:`MetadataStore.write_events` is a group commit; when it returns,
   every event of the batch is durable. On any failure it raises
   :class:`StoreWriteError` (``retryable``) and stores nothing of the batch.
3. Run ids are deterministic: ``asset_triggered__{N:012d}`` where ``N`` is the
   largest asset event id the run consumed, and a time-based run's id is
   its timetable's (``scheduled__<run_after>``); ``(dag_id, run_id)`` is
   unique, and queuing a time-based run whose id is stored queues nothing.
4. All datetimes are timezone-aware UTC.
5. A time-scheduled DAG's *bookkeeping* (its last automated data interval,
   its next run, and a ``revision`` bumped by every change of either or of
   its schedule) changes only in the transaction that queues its runs
   (:meth:`MetadataStore.queue_timed_runs`, a compare-and-set on
   ``revision``) or that changes its schedule (:meth:`sync_definitions`),
   so a run is queued once even when several triggerers decide at once.
6. A *dead letter* (a raw event the broker's own dead-letter destination
   refused for good, see :class:`~sharedstream.engine.producer.DeadLetter`) is kept
   once per ``(stream, source, reason)``, with at most
   :data:`DEAD_LETTER_PAYLOAD_LIMIT` bytes of its payload and the payload's
   original size.
"""

from __future__ import annotations

from collections.abc import Container, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from types import TracebackType
from typing import Any, Literal, Protocol, Self
from urllib.parse import urlsplit

from sharedstream.engine.errors import SharedStreamError
from sharedstream.engine.producer import DeadLetter
from sharedstream.store.outbox import OutboxStore
from sharedstream.store.replays import ReplayStore

__all__ = [
    "DEAD_LETTER_PAYLOAD_LIMIT",
    "RUN_STATE_QUEUED",
    "RUN_TYPES",
    "TRIGGER_STATES",
    "Claim",
    "DagRow",
    "DagSpec",
    "DeadLetterRow",
    "EventRow",
    "MetadataStore",
    "PendingEvent",
    "QueuedRuns",
    "RunRow",
    "Schedule",
    "SchemaStatus",
    "StoreError",
    "StoreWriteError",
    "TimedRun",
    "TriggerRow",
    "TriggerSpec",
    "TriggererRow",
    "WatcherSpec",
    "WriteResult",
    "redact_url",
]

TRIGGER_STATES = frozenset({"active", "finished", "failed", "orphaned"})
"""Every value :attr:`TriggerRow.state` can take."""

RUN_STATE_QUEUED = "queued"
"""The state of a DAG run created by :meth:`MetadataStore.write_events`."""

RUN_TYPES = frozenset({"asset_triggered", "scheduled", "manual"})
"""Every value :attr:`RunRow.run_type` can take (Airflow's names)."""

DEAD_LETTER_PAYLOAD_LIMIT = 256 * 1024
"""Most payload bytes :meth:`MetadataStore.add_dead_letter` keeps (a prefix); 256 KiB.

Big enough to read and replay any ordinary message, small enough that a
flood of oversized records (the usual reason a broker refuses a dead letter)
cannot bloat the metadata database.
"""


class StoreError(SharedStreamError):
    """The metadata store refused or failed an operation.

    Raised for bad definitions (an invalid schedule, a watcher naming an
    unknown trigger), a database newer than this code, a closed store, or a
    read that failed. Not retryable: the cause is in data or configuration.
    """


class StoreWriteError(StoreError):
    """A write transaction failed and was rolled back; nothing of it is visible.

    Always chained (``raise ... from``) to the underlying error. Retryable:
    the typical causes (a lock held too long by another process, a full or
    briefly unavailable disk) go away, and the broker redelivers whatever the
    caller did not get confirmed.
    """

    retryable = True


def redact_url(url: str) -> str:
    """``url`` with its password (if any) replaced by ``********``: safe for messages and logs."""
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:
        return url.split("://", 1)[0] + "://********"
    if password is None:
        return url
    userinfo, _, hostinfo = parts.netloc.rpartition("@")
    user = userinfo.partition(":")[0]
    return parts._replace(netloc=f"{user}:********@{hostinfo}").geturl()


@dataclass(frozen=True, slots=True)
class SchemaStatus:
    """A database's schema version (``current``, 0 before any migration) and this code's."""

    current: int
    latest: int

    @property
    def behind(self) -> bool:
        """Whether :meth:`MetadataStore.migrate` has steps to apply."""
        return self.current < self.latest

    @property
    def newer(self) -> bool:
        """Whether a newer sharedstream migrated the database (this one refuses it)."""
        return self.current > self.latest


@dataclass(frozen=True, slots=True)
class TriggerSpec:
    """A trigger as the definitions file declares it.

    ``kwargs_blob`` is already serialized and encrypted by the caller.
    ``pinned``: the first registration's ``classpath`` and ``kwargs_blob``
    stay (a later sync of the same fingerprint does not replace them), for a
    trigger whose serialized form depends on when it was declared
    (``BaseTrigger.identity``).
    """

    fingerprint: str
    classpath: str
    kwargs_blob: bytes
    pinned: bool = False
    queue: str | None = None
    """The trigger queue (``None``: none); stored on every sync, pinned or not."""


@dataclass(frozen=True, slots=True)
class WatcherSpec:
    """Asset ``asset`` watches the trigger ``trigger_fingerprint`` under ``name``."""

    asset: str
    name: str
    trigger_fingerprint: str


@dataclass(frozen=True, slots=True)
class DagSpec:
    """A DAG as the definitions file declares it.

    ``schedule`` is its asset condition, a tree :class:`Schedule` accepts, or
    ``None`` when no asset schedules it. ``timetable`` is its serialized
    timetable (JSON-able; the store keeps it as text and never looks
    inside), or ``None`` when no time does; ``summary`` says the timetable
    in a few words for listings. ``start_date``/``end_date`` (aware) bound
    its time-based runs; ``catchup`` says whether missed ones are queued.
    ``target`` is where its runs are dispatched, ``{"name": ..., "options":
    {...}}`` (JSON-able; ``None``: nowhere), kept for listings.
    ``batching`` makes its asset-triggered runs batches (``{"max_events":
    n or None, "max_wait": seconds or None}``; ``None``: a run as soon as
    the schedule holds): see :meth:`MetadataStore.release_batches`.
    """

    dag_id: str
    schedule: dict[str, Any] | None
    timetable: dict[str, Any] | None = None
    summary: str | None = None
    start_date: datetime | None = None
    end_date: datetime | None = None
    catchup: bool = False
    target: dict[str, Any] | None = None
    batching: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class TimedRun:
    """A time-based run: its deterministic id, logical date, data interval and run-after time.

    ``run_after`` is the earliest moment it may be queued.
    """

    run_id: str
    logical_date: datetime
    data_interval_start: datetime
    data_interval_end: datetime
    run_after: datetime
    run_type: str = "scheduled"


@dataclass(frozen=True, slots=True)
class DagRow:
    """A stored DAG with its time-schedule bookkeeping.

    ``timetable`` and ``summary`` are ``None`` for a DAG no time schedules.
    ``last_interval`` is the data interval of the last time-based run the
    schedule loop queued (``None`` before the first); ``next_run`` is the
    next one as the loop last computed it (``None`` when not computed yet
    or when the timetable has no more runs). ``revision`` is what
    :meth:`MetadataStore.queue_timed_runs` compares. ``last_run_id`` /
    ``last_run_at`` are the DAG's newest run of any type. ``paused``: its
    runs are not dispatched (``sharedstream dags pause``); ``target`` and
    ``batching`` as :class:`DagSpec` gives them.
    """

    dag_id: str
    schedule: dict[str, Any] | None
    timetable: dict[str, Any] | None
    summary: str | None
    start_date: datetime | None
    end_date: datetime | None
    catchup: bool
    last_interval: tuple[datetime, datetime] | None
    next_run: TimedRun | None
    revision: int
    last_run_id: str | None = None
    last_run_at: datetime | None = None
    paused: bool = False
    target: dict[str, Any] | None = None
    batching: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class QueuedRuns:
    """What :meth:`MetadataStore.queue_timed_runs` did.

    ``applied`` is false when the DAG's revision had moved (another
    triggerer queued first, or its schedule changed, or it is gone): then
    nothing was written. ``queued`` lists the run ids inserted, in order
    (a run id already stored is skipped).
    """

    applied: bool
    queued: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class TriggerRow:
    """A stored trigger. ``state`` is one of :data:`TRIGGER_STATES`.

    ``error_count`` and the ``last_*`` fields survive state changes, including
    reactivation by a later :meth:`MetadataStore.sync_definitions`.
    ``events_stored`` counts the trigger events stored for it (duplicates
    excluded).
    """

    id: int
    fingerprint: str
    classpath: str
    kwargs_blob: bytes
    state: str
    error_count: int
    last_error: str | None
    last_traceback: str | None
    last_error_at: datetime | None
    created_at: datetime
    events_stored: int
    watchers: tuple[str, ...] = ()
    """``asset/watcher`` names of the watchers using it, sorted; filled by
    :meth:`MetadataStore.list_triggers` only (empty elsewhere)."""
    queue: str | None = None
    """The trigger queue its definition names (``None``: none); see ``[triggerer] queues``."""


@dataclass(frozen=True, slots=True)
class PendingEvent:
    """A trigger event to store; ``payload`` is already serialized by the caller.

    ``idem_key`` (when not ``None``) makes the event idempotent store-wide; see
    the module docstring for what it must contain. ``trace_parent`` is the
    W3C ``traceparent`` value of the span that processed the event (or
    ``None``), kept as given; a duplicate's is dropped with it.
    ``fingerprint`` is the broker message's fingerprint (or ``None``): with
    ``idem_key``, it tells a redelivery from a new message that reused the
    key's broker name (see *message fingerprint* in the module docstring);
    ignored without ``idem_key``.
    """

    trigger_id: int
    idem_key: str | None
    payload: bytes
    trace_parent: str | None = None
    fingerprint: str | None = None


@dataclass(frozen=True, slots=True)
class WriteResult:
    """What one :meth:`MetadataStore.write_events` batch did.

    ``stored + duplicates`` equals the batch size. ``dag_runs`` lists the
    runs created, as ``"dag_id/run_id"``, in creation order. ``renamed``
    names, as ``(trigger_id, idem_key)`` in batch order, the stored events
    (counted in ``stored``) whose key was stored already for another message
    (their fingerprints differ) and which were therefore stored under
    ``f"{idem_key}#{fingerprint}"``; usually empty.
    """

    stored: int
    duplicates: int
    asset_events: int
    dag_runs: tuple[str, ...]
    renamed: tuple[tuple[int, str], ...] = ()


@dataclass(frozen=True, slots=True)
class EventRow:
    """A stored trigger event and the names of the assets it produced events for (sorted).

    ``trace_parent`` is the one it was stored with (``None`` when it had none).
    """

    id: int
    trigger_id: int
    idem_key: str | None
    payload: bytes
    created_at: datetime
    assets: tuple[str, ...]
    trace_parent: str | None = None


@dataclass(frozen=True, slots=True)
class RunRow:
    """A DAG run with the asset events it consumed (ids ascending, asset names sorted).

    ``run_type`` is one of :data:`RUN_TYPES`. A time-based run has its
    logical date and data interval; an asset-triggered one has neither
    (``None``). ``run_after`` is when it became due (an asset-triggered
    run: when it was queued). ``trace_parent`` is, for an asset-triggered
    run, that of the stored event whose asset event completed its
    condition (``None`` when that event had none); ``None`` for the others.

    Dispatch (:mod:`sharedstream.store.outbox`): ``state`` is one of
    :data:`~sharedstream.store.outbox.RUN_STATES`; ``target`` the target it
    was last claimed for; ``attempts`` how many deliveries were tried;
    ``last_error`` the last one-line detail; ``external_id`` /
    ``external_url`` the target's own name of it; ``dispatched_at`` when it
    first reached the target, ``ended_at`` when it finished; ``conf`` a
    manual run's configuration.
    """

    id: int
    dag_id: str
    run_id: str
    state: str
    created_at: datetime
    asset_event_ids: tuple[int, ...]
    assets: tuple[str, ...]
    run_type: str = "asset_triggered"
    logical_date: datetime | None = None
    data_interval_start: datetime | None = None
    data_interval_end: datetime | None = None
    run_after: datetime | None = None
    trace_parent: str | None = None
    target: str | None = None
    attempts: int = 0
    last_error: str | None = None
    external_id: str | None = None
    external_url: str | None = None
    dispatched_at: datetime | None = None
    ended_at: datetime | None = None
    conf: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class TriggererRow:
    """A triggerer process as last reported by :meth:`MetadataStore.heartbeat`.

    ``running`` is the ids of the triggers it said it runs, sorted.
    """

    id: str
    hostname: str
    pid: int
    started_at: datetime
    heartbeat_at: datetime
    running: tuple[int, ...] = ()

    def alive(self, now: datetime, threshold: float) -> bool:
        """Whether its last heartbeat is at most ``threshold`` seconds before ``now``."""
        return (now - self.heartbeat_at).total_seconds() <= threshold


@dataclass(frozen=True, slots=True)
class Claim:
    """What :meth:`MetadataStore.claim_triggers` left a triggerer with.

    ``owned``: the candidate triggers it owns now (ids, sorted) - the ones
    it must run, and the only ones. ``elsewhere``: how many other active
    candidates it does not own (owned by live triggerers, being claimed by
    one, or past its capacity): a triggerer with nothing owned but something
    elsewhere is a standby, not idle.
    """

    owned: tuple[int, ...]
    elsewhere: int


@dataclass(frozen=True, slots=True)
class DeadLetterRow:
    """A :class:`~sharedstream.engine.producer.DeadLetter` as the store keeps it.

    ``payload`` is the stored prefix of the body (at most
    :data:`DEAD_LETTER_PAYLOAD_LIMIT` bytes) and ``payload_size`` the size of
    the whole body; ``triggers`` and ``headers`` are as the producer gave
    them, in order. ``created_at`` is when the first copy was stored.
    """

    id: int
    created_at: datetime
    stream: str
    source: str
    reason: str
    triggers: tuple[str, ...]
    payload: bytes
    payload_size: int
    headers: tuple[tuple[str, bytes], ...]
    redriven_at: datetime | None = None
    """When it was last re-driven to its source (``sharedstream deadletters redrive``)."""
    redrives: int = 0
    """How many times it was re-driven."""

    @property
    def truncated(self) -> bool:
        """Whether only a prefix of the body was kept."""
        return len(self.payload) < self.payload_size


@dataclass(frozen=True, slots=True)
class Schedule:
    """A validated asset schedule tree.

    The JSON form is ``{"asset": "name"}``, ``{"all": [subtrees]}`` or
    ``{"any": [subtrees]}``; ``all`` and ``any`` need at least one child.
    Against a set of asset names with pending queue entries, a leaf is
    satisfied when its asset is in the set, ``all`` when every child is, and
    ``any`` when some child is.
    """

    op: Literal["asset", "all", "any"]
    asset: str | None = None
    children: tuple[Schedule, ...] = ()

    @classmethod
    def parse(cls, tree: object, *, where: str = "schedule") -> Schedule:
        """Validate a JSON-able tree; raises :class:`StoreError` naming the bad node."""
        if not isinstance(tree, Mapping) or len(tree) != 1:
            raise StoreError(
                f"{where}: expected a mapping with exactly one of 'asset', 'all', 'any',"
                f" got {tree!r}"
            )
        ((op, value),) = tree.items()
        if op == "asset":
            if not isinstance(value, str) or not value:
                raise StoreError(f"{where}.asset: expected a non-empty asset name, got {value!r}")
            return cls("asset", asset=value)
        if op in ("all", "any"):
            if isinstance(value, str | bytes) or not isinstance(value, Sequence) or not value:
                raise StoreError(f"{where}.{op}: expected a non-empty list of subtrees")
            children = tuple(
                cls.parse(child, where=f"{where}.{op}[{index}]")
                for index, child in enumerate(value)
            )
            return cls("all" if op == "all" else "any", children=children)
        raise StoreError(f"{where}: unknown operator {op!r} (expected 'asset', 'all' or 'any')")

    @property
    def assets(self) -> frozenset[str]:
        """Every asset name the tree mentions."""
        if self.asset is not None:
            return frozenset((self.asset,))
        return frozenset().union(*(child.assets for child in self.children))

    def satisfied(self, pending: Container[str]) -> bool:
        """Whether the tree holds when exactly the assets in ``pending`` have queue entries."""
        if self.asset is not None:
            return self.asset in pending
        if self.op == "all":
            return all(child.satisfied(pending) for child in self.children)
        return any(child.satisfied(pending) for child in self.children)


class MetadataStore(OutboxStore, ReplayStore, Protocol):
    """What the runtime and the CLI need from a metadata database.

    An instance is used from one thread at a time. Every mutation is a single
    transaction (see the module docstring for the contracts; the dispatch
    methods are :class:`~sharedstream.store.outbox.OutboxStore`'s). Build one
    with :func:`sharedstream.store.open_store`.
    """

    location: str
    """The database, for messages and logs: a file path, or a URL without its password."""

    def schema_status(self) -> SchemaStatus:
        """The database's schema version and this code's; changes nothing.

        Raises :class:`StoreError` when the database cannot be read.
        """
        ...

    def migrate(self) -> int:
        """Bring the schema up to date; idempotent. Returns the schema version.

        Raises :class:`StoreError` when the database is newer than this code.
        """
        ...

    def sync_definitions(
        self,
        triggers: Sequence[TriggerSpec],
        watchers: Sequence[WatcherSpec],
        dags: Sequence[DagSpec],
    ) -> dict[str, int]:
        """Register the definitions in one transaction; returns fingerprint -> trigger id.

        Triggers are upserted by fingerprint (classpath and blob updated). A
        trigger some watcher references is active (an orphaned or failed one
        is reactivated, error history kept; a finished one stays finished);
        every other trigger becomes orphaned. Watchers and DAGs are replaced
        wholesale; a DAG that stays keeps its pending queue entries for the
        assets its schedule still mentions. Every asset mentioned is
        registered. Bad definitions raise :class:`StoreError` and change
        nothing.

        Time-schedule bookkeeping: a DAG whose timetable, start date, end
        date and catchup are unchanged keeps it as it was (revision too). A
        change of any of them keeps the last automated data interval (the
        new timetable continues after it, as Airflow does), forgets the next
        run and bumps the revision. A DAG new to the store starts from the
        data interval of its newest stored ``scheduled`` run, if any (a DAG
        removed and added back queues no run twice).
        """
        ...

    def list_dags(self) -> list[DagRow]:
        """Every DAG, by id, with its time-schedule bookkeeping and newest run."""
        ...

    def queue_timed_runs(
        self, dag_id: str, revision: int, runs: Sequence[TimedRun], next_run: TimedRun | None
    ) -> QueuedRuns:
        """Queue a DAG's due time-based runs and advance its bookkeeping, in one transaction.

        A compare-and-set: only if the DAG's stored revision is still
        ``revision`` (PostgreSQL: checked under a lock on its row, so a
        triggerer racing another waits, then finds the revision moved and
        writes nothing). Then each run is inserted in order unless its run
        id is stored already, the last automated data interval becomes the
        last run's (unchanged if ``runs`` is empty), the next run becomes
        ``next_run`` and the revision is bumped. Idempotent by run id. On
        failure raises :class:`StoreWriteError` and changes nothing.
        """
        ...

    def active_triggers(self, limit: int) -> list[TriggerRow]:
        """At most ``limit`` triggers in state ``active``, by id."""
        ...

    def get_trigger(self, trigger_id: int) -> TriggerRow | None:
        """The trigger with this id, or ``None``."""
        ...

    def record_trigger_error(self, trigger_id: int, message: str, traceback: str) -> None:
        """Count one error of the trigger and remember it as the last one."""
        ...

    def clear_trigger_error(self, trigger_id: int) -> None:
        """The trigger works again: forget its last error's text and traceback.

        ``error_count`` and ``last_error_at`` stay (how often, and when it
        last failed), so ``triggers list`` shows an empty ``LAST_ERROR`` for
        a trigger that recovered. Called by the supervisor (see
        :data:`~sharedstream.runtime.supervisor.STABLE_AFTER`); idempotent.
        """
        ...

    def set_trigger_state(self, trigger_id: int, state: str) -> None:
        """Set the state (one of :data:`TRIGGER_STATES`) of an existing trigger."""
        ...

    def write_events(self, batch: Sequence[PendingEvent]) -> WriteResult:
        """Store a batch in one transaction (group commit) and derive asset events and runs.

        Per event, in order: a non-``None`` ``idem_key`` already stored makes
        it a duplicate (nothing else happens for it); otherwise the trigger
        event is stored, one asset event is created per asset watching its
        trigger, each joins the pending queue of every DAG whose schedule
        mentions the asset; then each such DAG whose schedule is now satisfied
        gets one queued run consuming its whole queue (evaluated once per
        event, so one event watched by two assets makes at most one run per
        DAG); that run keeps the event's ``trace_parent``. Durable when it
        returns; on failure raises :class:`StoreWriteError` and stores nothing.
        """
        ...

    def release_batches(self) -> list[str]:
        """Make the runs of batched DAGs whose batch is due; ``"dag_id/run_id"`` of each.

        A DAG with ``batching`` (see :class:`DagSpec`) only queues in
        :meth:`write_events`; here, in one transaction, each such DAG whose
        schedule holds for its oldest ``max_events`` queued asset events (all
        of them without ``max_events``), and that are that many or have
        waited ``max_wait`` seconds (or without ``max_wait``), gets a run
        consuming them, with the usual deterministic run id; repeated while
        the queue has more due batches. Safe against concurrent writers and
        passes (PostgreSQL: the DAGs' rows are locked). On failure raises
        :class:`StoreWriteError` and changes nothing.
        """
        ...

    def heartbeat(
        self, triggerer_id: str, hostname: str, pid: int, running: Sequence[int] = ()
    ) -> None:
        """Record that the triggerer is alive and runs ``running`` (first call registers it).

        The heartbeat is also the lease of every standalone trigger the
        triggerer owns (see :meth:`claim_triggers`): a triggerer whose last
        heartbeat is older than the health-check threshold loses them.
        PostgreSQL stamps it with the server's clock, so leases do not
        depend on the triggerers' clocks agreeing.
        """
        ...

    def claim_triggers(
        self, triggerer_id: str, candidates: Sequence[int], capacity: int, threshold: float
    ) -> Claim:
        """Assign standalone triggers to ``triggerer_id``, one transaction; returns what it owns.

        Of the ``active`` triggers among ``candidates``: it keeps those it
        owns, and takes (in id order, until it owns ``capacity``) those owned
        by nobody or by a triggerer whose last heartbeat is more than
        ``threshold`` seconds old. A trigger another triggerer is claiming at
        the same moment is skipped, never waited for (PostgreSQL: ``FOR
        UPDATE SKIP LOCKED``), so no trigger gets two owners. Called after
        each heartbeat; idempotent. Raises :class:`StoreWriteError`
        (retryable) and changes nothing on failure.
        """
        ...

    def release_triggers(self, triggerer_id: str) -> None:
        """Give up every trigger ``triggerer_id`` owns (a graceful stop), so others take them now.

        One transaction; idempotent. Raises :class:`StoreWriteError` on failure
        (the triggers are then taken over after the threshold instead).
        """
        ...

    def sign_off(self, triggerer_id: str) -> None:
        """A triggerer stopped cleanly: give up its triggers and remove its row, one transaction.

        Others take its standalone triggers (and its dispatch claims) at once
        instead of after the health-check threshold, and ``triggerers list``
        no longer shows it as alive. A triggerer that crashed never signs off:
        its row stays, counted dead after the threshold, until retention
        prunes it. Idempotent. Raises :class:`StoreWriteError` on failure
        (nothing changes; the threshold then does the same, later).
        """
        ...

    def triggerers(self) -> list[TriggererRow]:
        """Every triggerer that sent a heartbeat and has not signed off nor been pruned, by id."""
        ...

    def list_triggers(self) -> list[TriggerRow]:
        """Every trigger, by id, with the watchers that use it."""
        ...

    def list_events(
        self, *, asset: str | None = None, trigger_id: int | None = None, limit: int = 100
    ) -> list[EventRow]:
        """Trigger events, newest first, optionally of one trigger and/or one asset."""
        ...

    def list_runs(
        self, *, dag_id: str | None = None, asset: str | None = None,
        state: str | None = None, run_id: str | None = None, limit: int = 100,
    ) -> list[RunRow]:
        """DAG runs, newest first, optionally of one DAG, one state, using one asset's events."""
        ...

    def counts(self) -> dict[str, int]:
        """Row counts under the keys triggers, trigger_events, asset_events, dag_runs."""
        ...

    def add_dead_letter(self, letter: DeadLetter) -> bool:
        """Keep a raw event the broker's dead-letter destination refused; one transaction.

        Called by a producer's dead-letter fallback before the broker is
        advanced past the event, so it must be durable when it returns.
        Stores the first :data:`DEAD_LETTER_PAYLOAD_LIMIT` bytes of the
        payload and its whole size. Idempotent per ``(stream, source,
        reason)``: returns ``True`` when a row was written, ``False`` when one
        with that identity was already kept (a redelivery after a crash; the
        first row is left as it was). On failure raises
        :class:`StoreWriteError` (``retryable``) and keeps nothing.
        """
        ...

    def dead_letters(self, limit: int, *, stream: str | None = None,
                     ids: Sequence[int] | None = None) -> list[DeadLetterRow]:
        """At most ``limit`` kept dead letters, newest first, of one stream and/or ``ids``."""
        ...

    def dead_letters_of(self, trigger_id: int, limit: int, *, after: int = 0,
                        before: int | None = None) -> list[DeadLetterRow]:
        """At most ``limit`` dead letters ``trigger_id`` caused, oldest (lowest id) first.

        Caused: the trigger's id is among the letter's ``triggers`` (it
        rejected the message or kept failing on it). Only ids greater than
        ``after`` and, when given, less than ``before``. A read: pages
        through the letters with ``after`` set to the last id seen.
        """
        ...

    def dead_letter_span(self, trigger_id: int) -> tuple[int, int] | None:
        """The lowest and highest ids of the dead letters ``trigger_id`` caused; ``None``: none."""
        ...

    def add_raw_failures(self, names: Sequence[str]) -> None:
        """Count one more failure against each raw event in ``names``; one transaction.

        A raw event's name is its producer's (``raw_event_name``: it names
        the broker entity and the message); a name listed twice counts twice.
        Called when a watcher failed on the message itself, before the
        broker is told, so it must be durable when it returns. Raises
        :class:`StoreWriteError` (``retryable``) and counts nothing on failure.
        """
        ...

    def raw_failures(self, names: Sequence[str]) -> dict[str, int]:
        """The failures :meth:`add_raw_failures` counted against those of ``names`` that have any.

        A name with no failures (or whose count was pruned) is left out.
        """
        ...

    def mark_redriven(self, ids: Sequence[int]) -> int:
        """Record that these dead letters were re-driven now (one more each); how many."""
        ...

    def close(self) -> None:
        """Release the connection; idempotent."""
        ...

    def __enter__(self) -> Self: ...

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...
