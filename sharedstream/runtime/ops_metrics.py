"""``/metrics``: the triggerer's numbers in the Prometheus text format, read at scrape time.

A :class:`TriggererCollector` is a ``prometheus_client`` collector on a
registry of its own (one per endpoint, never the process-wide default). It
keeps nothing: every scrape reads the counters the runtime already keeps
(the persist gate's, the manager's totals, the supervisor's progress, the
process's broker calls) and walks the live groups for lag, exactly like a
status does (:class:`~sharedstream.runtime.ops_view.TriggererView`). The
brokers' own backlog is the last reading of the endpoint's
:class:`~sharedstream.runtime.ops_backlog.BacklogPoller`: a scrape never
asks a broker. So the
hot path pays nothing for it - no instrument call, no lock - and a scrape
costs O(streams + watchers + lanes).

Why not OpenTelemetry's Prometheus exporter over the engine's instruments
(:mod:`sharedstream.engine.telemetry`): it needs the SDK installed as the
process's one meter provider, which turns every instrument call on the
advance path from a no-op (~70 ns) into a recorded measurement (~5 us on
our loaded 2-core machine), and its scrape of 1,000 series took ~20 ms
against ~5 ms here. An application that installs the SDK still gets those
instruments through its own exporter; the two can run side by side.

Called on the event loop (``generate_latest`` inside the request handler),
so every read sees a consistent loop state.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
    SummaryMetricFamily,
)
from prometheus_client.registry import Collector

from sharedstream.brokerkit.calls import PROCESS_CALLS
from sharedstream.dispatch.dispatcher import LATENCY_BUCKETS, Dispatcher
from sharedstream.runtime.ops_backlog import PENDING
from sharedstream.runtime.ops_base import ObservedTriggerer
from sharedstream.runtime.ops_dispatch import OUTCOMES
from sharedstream.runtime.ops_view import (
    TriggererView,
    lane_label,
    stream_label,
    watcher_counts,
)

__all__ = ["TriggererCollector"]

_P = "sharedstream_"


def _counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(_P + name, doc, value=value)


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(_P + name, doc, value=value)


class TriggererCollector(Collector):
    """The metrics of one running triggerer (see the module docstring and docs/operations.md)."""

    def __init__(self, triggerer: ObservedTriggerer, view: TriggererView) -> None:
        self._triggerer = triggerer
        self._view = view

    def collect(self) -> Iterator[Metric]:
        """Yield every family; called by ``generate_latest`` on the event loop."""
        yield from self._totals()
        yield from self._streams()
        calls = CounterMetricFamily(_P + "broker_requests",
                                    "Broker API calls made by producers of this process",
                                    labels=["broker", "operation"])
        for (broker, operation), n in sorted(PROCESS_CALLS.items()):
            calls.add_metric([broker, operation], n)
        yield calls
        service = self._triggerer.dispatch
        if service is not None and service.dispatcher is not None:
            yield from dispatch_metrics(service.dispatcher)
        yield from self._replay()

    def _replay(self) -> Iterator[Metric]:
        """The replay this triggerer runs now: messages done and planned, events stored."""
        loop = self._triggerer.replays
        current = None if loop is None else loop.current
        messages = GaugeMetricFamily(_P + "replay_messages",
                                     "Messages of the replay this triggerer runs: done, total",
                                     labels=["replay", "watcher", "kind"])
        events = GaugeMetricFamily(_P + "replay_events_stored",
                                   "New trigger events the running replay stored",
                                   labels=["replay", "watcher"])
        if current is not None:
            labels = [str(current.row.id), current.row.watcher]
            messages.add_metric([*labels, "done"], current.progress.done)
            if current.row.total is not None:
                messages.add_metric([*labels, "total"], current.row.total)
            events.add_metric(labels, current.progress.stored)
        yield messages
        yield events

    def _totals(self) -> Iterator[Metric]:
        t = self._triggerer
        gate, totals, progress = t.gate, t.manager.totals, t.progress
        yield _gauge("triggers_running", "Triggers running in this triggerer", progress.running)
        yield _counter("trigger_restarts", "Trigger restarts after a failure", progress.restarts)
        yield _counter("events_stored", "Trigger events stored (duplicates excluded)",
                       gate.stored)
        yield _counter("events_duplicates", "Trigger events skipped as already stored",
                       gate.duplicates)
        yield _counter("events_refused", "Trigger events the store could not take "
                       "(their raw events rejected)", progress.refused)
        yield _counter("dag_runs_queued", "DAG runs queued (asset-triggered and scheduled)",
                       t.runs_queued)
        latency = SummaryMetricFamily(_P + "store_write_seconds",
                                      "Group commits: from taking a batch to confirming it",
                                      count_value=gate.commits, sum_value=gate.commit_seconds)
        yield latency
        yield _counter("store_write_retries", "Store writes that failed and were retried",
                       gate.failed_writes)
        yield _gauge("store_queue", "Trigger events waiting to be written", gate.queued)
        yield _gauge("store_failing", "1 while writes to the store fail", int(gate.store_failing))
        advanced = CounterMetricFamily(_P + "raw_events_advanced",
                                       "Raw events advanced (acknowledged or settled), by outcome",
                                       labels=["outcome"])
        for outcome in ("clean", "failed", "rejected"):
            advanced.add_metric([outcome], getattr(totals, outcome))
        yield advanced
        yield _counter("dead_letters", "Raw events dead-lettered by the producers",
                       totals.dead_lettered)
        yield _counter("dead_letter_fallbacks", "Dead letters kept in the store's table "
                       "(the broker's destination refused them)", progress.fallbacks)
        paused = GaugeMetricFamily(_P + "intake_paused", "1 while every stream's intake is "
                                   "held, by reason (store, stopping)", labels=["reason"])
        for reason in sorted(t.manager.intake.reasons):
            paused.add_metric([reason], 1)
        yield paused

    def _streams(self) -> Iterator[Metric]:
        up = GaugeMetricFamily(_P + "stream_up", "1 while the stream's poll runs",
                               labels=["stream"])
        connected = GaugeMetricFamily(
            _P + "stream_connected", "1 while the stream's producer is connected to its broker "
            "(absent where the producer cannot tell)", labels=["stream"])
        outstanding = GaugeMetricFamily(
            _P + "stream_outstanding", "Raw events fanned out and not yet resolved, per stream",
            labels=["stream"])
        age = GaugeMetricFamily(
            _P + "stream_oldest_unresolved_age_seconds",
            "Age of the stream's oldest unresolved raw event (0 if none)", labels=["stream"])
        lanes = GaugeMetricFamily(
            _P + "lane_outstanding", "Raw events fanned out and not yet resolved, per lane",
            labels=["stream", "lane"])
        paused = CounterMetricFamily(
            _P + "stream_paused_seconds", "Seconds the stream's poll was held, by reason "
            "(intake: the store was behind or the triggerer stopping; watcher_behind: a "
            "watcher's queue was full)", labels=["stream", "reason"])
        labels = ["stream", "trigger", "watchers"]
        lag = GaugeMetricFamily(
            _P + "watcher_lag", "Raw events queued for a watcher's filter and not yet pulled",
            labels=labels)
        why = {
            "seen": CounterMetricFamily(_P + "watcher_raw_events", "Raw events broadcast to "
                                        "the watcher's stream since it joined the poll",
                                        labels=labels),
            "skipped": CounterMetricFamily(_P + "watcher_skipped", "Raw events the watcher's "
                                           "prefilter declined (never given to its filter)",
                                           labels=labels),
            "emitted": CounterMetricFamily(_P + "watcher_emitted", "Trigger events the "
                                           "watcher's filter yielded", labels=labels),
            "rejected": CounterMetricFamily(_P + "watcher_rejected", "Raw events the watcher "
                                            "rejected", labels=labels),
            "failed": CounterMetricFamily(_P + "watcher_failed", "Attempts of the watcher's "
                                          "filter that failed", labels=labels),
        }
        for key, group, members in self._triggerer.manager.streams():
            label = stream_label(key)
            up.add_metric([label], int(group is not None))
            for reason, seconds in (group.paused.items() if group is not None else ()):
                paused.add_metric([label, reason], seconds)
            state = group.connected() if group is not None else False
            if state is not None:
                connected.add_metric([label], int(state))
            book = group.book if group is not None else None
            queued = group.queued() if group is not None else {}
            if book is not None:
                outstanding.add_metric([label], book.outstanding())
                since = book.oldest_unresolved_at()
                age.add_metric([label], 0.0 if since is None else max(0.0, book.clock() - since))
                for lane, n in book.lanes_snapshot():
                    lanes.add_metric([label, lane_label(lane)], n)
            for trigger_id in sorted({*members, *queued}, key=str):
                names = ",".join(self._view.names(trigger_id))
                values = [label, str(trigger_id), names]
                lag.add_metric(values, queued.get(trigger_id, 0))
                counts = watcher_counts(group, trigger_id)
                for name, family in why.items():
                    family.add_metric(values, counts[name])
        yield from (up, connected, paused, outstanding, age, lanes, lag, *why.values())
        yield from self._backlog()

    def _backlog(self) -> Iterator[Metric]:
        """The brokers' own backlog per stream, lane and kind, as last polled."""
        backlog = GaugeMetricFamily(
            _P + "broker_backlog", "Messages the broker itself holds for the stream, by lane "
            "and kind (Kafka: lag; SQS: visible, in_flight, dead_letter; Service Bus: active, "
            "dead_letter), as last polled; absent unless the last poll answered",
            labels=["stream", "lane", "kind"])
        known = GaugeMetricFamily(
            _P + "broker_backlog_known", "1 when the stream's last backlog poll answered; 0 "
            "when it failed, the broker cannot tell (n/a), or it was not asked yet",
            labels=["stream"])
        poller = self._view.backlog
        for key, _group, _members in self._triggerer.manager.streams():
            label = stream_label(key)
            reading = poller.reading(key) if poller is not None else PENDING
            known.add_metric([label], int(reading.state == "ok"))
            for lane, kinds in sorted(reading.lanes.items()):
                for kind, count in sorted(kinds.items()):
                    backlog.add_metric([label, lane_label(lane), kind], count)
        yield from (backlog, known)


def dispatch_metrics(dispatcher: Dispatcher) -> Iterator[Metric]:
    """The dispatch metric families (see ``docs/operations.md``)."""
    runs = GaugeMetricFamily(_P + "dag_runs", "Unfinished DAG runs in the store, by DAG, "
                             "target and state (counted every follow_interval)",
                             labels=["dag", "target", "state"])
    for (dag, target, state), count in sorted(dispatcher.unfinished.items()):
        runs.add_metric([dag, target, state], count)
    yield runs
    attempts = CounterMetricFamily(_P + "dispatch_attempts", "What this process's deliveries "
                                   "and follow-ups came to, by target and outcome",
                                   labels=["target", "outcome"])
    errors = CounterMetricFamily(_P + "dispatch_errors", "Deliveries that failed (retried or "
                                 "undeliverable), by target", labels=["target"])
    busy = GaugeMetricFamily(_P + "dispatch_in_flight", "Deliveries under way, by target",
                             labels=["target"])
    failing = GaugeMetricFamily(_P + "dispatch_target_failing", "1 while a target's last "
                                "attempts all failed", labels=["target"])
    latency = HistogramMetricFamily(_P + "dispatch_latency_seconds", "From a run queued to "
                                    "its target having it, by target", labels=["target"])
    for name, stats in sorted(dispatcher.stats.items()):
        for outcome in OUTCOMES:
            attempts.add_metric([name, outcome], getattr(stats, outcome))
        errors.add_metric([name], stats.errors)
        busy.add_metric([name], dispatcher.slots[name].busy)
        failing.add_metric([name], int(stats.failing))
        buckets = [(f"{bound:g}", count)
                   for bound, count in zip(LATENCY_BUCKETS, stats.latency_buckets, strict=True)]
        latency.add_metric([name], [*buckets, ("+Inf", stats.latency_count)],
                           sum_value=stats.latency_sum)
    yield from (attempts, errors, busy, failing, latency)
