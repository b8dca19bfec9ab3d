"""`--metrics-port P`: the run's numbers for Prometheus at http://HOST:P/metrics.

Rendered from one snapshot when a scrape arrives, never per request: between
scrapes this costs nothing. In a headless run the snapshot (and the latency
histograms' buckets) is taken on the engine's loop, so it is consistent; in
the console the engine runs in a child process and the scrape reads the
latest snapshot the console already receives from it.

Names follow Prometheus conventions (base units, `_total` counters, labels
that are key ids like `k1`, never secrets); see docs/prometheus.md
for the list. At the end of a run the counters equal the report's.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import errno
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.core import (
    CollectorRegistry,
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from ratedeck.core.vocab import Phase
from ratedeck.engine.snapshot import ClientView, LatencySummary, Snapshot
from ratedeck.gateway.batches.records import FINAL, UNFINISHED

#: Latency histogram bucket edges, in milliseconds (exported in seconds).
QUANTILES = (("0.5", "p50"), ("0.9", "p90"), ("0.99", "p99"), ("0.999", "p999"), ("1", "max"))
STAGES = (
    ("send_answer", "latency"),  # send -> answer, successes
    ("arrival_done", "latency_total"),  # arrival (intended) -> done, successes
    ("queue_wait", "queue_wait"),  # arrival -> first send
)
_SCRAPE_WAIT_S = 2.0  # a scrape waits this long for the engine's loop, then uses the last snapshot

Buckets = tuple[tuple[float, int], ...]  # (upper edge in ms, cumulative count), +Inf not included


@dataclass(frozen=True)
class Scrape:
    """What one scrape renders: a snapshot and, where known, the latency histograms' buckets."""

    snap: Snapshot
    buckets: dict[str, Buckets] = field(default_factory=dict)  # "latency", "latency_total", "queue_wait"


def engine_scrape(engine: Any) -> Scrape:
    """A consistent scrape of an engine: call on the engine's loop."""
    return Scrape(engine.snapshot())


class LoopSource:
    """Scrapes for a headless run: taken on the engine's loop when a scrape arrives.

    Before the engine starts, a scrape sees an empty snapshot; after the run,
    the final one (`finish`).
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, capacity_tps: float = 0.0):
        self.loop = loop
        self.engine: Any = None
        self._last = Scrape(Snapshot(phase=Phase.STARTING, capacity_tps=capacity_tps))
        self._final: Scrape | None = None

    def finish(self, scrape: Scrape) -> None:
        self._final = self._last = scrape

    def __call__(self) -> Scrape:
        if self._final is not None or self.engine is None:
            return self._last
        done: concurrent.futures.Future[Scrape] = concurrent.futures.Future()
        engine = self.engine

        def take() -> None:
            try:
                done.set_result(engine_scrape(engine))
            except BaseException as exc:
                done.set_exception(exc)

        try:
            self.loop.call_soon_threadsafe(take)
            self._last = done.result(_SCRAPE_WAIT_S)
        except (RuntimeError, concurrent.futures.TimeoutError):  # loop closed or busy: the last one
            pass
        return self._last


class SnapshotCollector:
    """A prometheus_client collector that renders a `Scrape` from `source()` at each collect.

    `last_cpu_s` is the CPU time the scraping thread spent on the last scrape,
    building the families and formatting them (prometheus_client formats
    each family as it is yielded, before asking for the next); time spent
    waiting for the engine's loop is not in it.
    """

    def __init__(self, source: Callable[[], Scrape]):
        self.source = source
        self.last_cpu_s = 0.0

    def collect(self) -> Iterator[Metric]:
        start = time.thread_time()
        scrape = self.source()
        yield from families(scrape.snap, scrape.buckets)
        self.last_cpu_s = time.thread_time() - start


def _seconds(ms: float) -> float:
    return ms / 1000.0


def _counter(name: str, doc: str, value: float | None = None, labels: tuple[str, ...] = ()):
    family = CounterMetricFamily(name, doc, value=value, labels=labels or None)
    return family


def families(snap: Snapshot, buckets: dict[str, Buckets] | None = None) -> list[Metric]:
    """Every metric family for one snapshot, in a fixed order (scrapes diff cleanly)."""
    return [
        *_request_families(snap),
        *_attempt_families(snap),
        *_key_families(snap),
        *_gate_families(snap),
        *_run_families(snap),
        *_job_families(snap),
        *_latency_families(snap, buckets or {}),
        *_message_families(snap),
        *_spend_families(snap),
        *_endpoint_families(snap),
        *(client_families(snap.clients) if snap.clients is not None else ()),
    ]


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value)


def _labelled(family: Any, rows: Iterable[tuple[Any, float]]) -> Any:
    """`family` with one sample per (label, value) row; a label is a string or a list of them."""
    for label, value in rows:
        family.add_metric([label] if isinstance(label, str) else list(label), value)
    return family


def _request_families(snap: Snapshot) -> list[Metric]:
    """Requests: each ends in one place, or is still pending somewhere."""
    ended = _counter(
        "ratedeck_requests",
        "Requests that ended, by where (succeeded, expired, graveyard, shed, uncertain).",
        None,
        ("outcome",),
    )
    pending = GaugeMetricFamily(
        "ratedeck_requests_pending", "Requests not ended yet, by where they are.", labels=["where"]
    )
    return [
        _counter("ratedeck_requests_generated", "Requests made by the workload.", snap.generated),
        _labelled(
            ended,
            (
                ("succeeded", snap.succeeded),
                ("expired", snap.expired),
                ("graveyard", snap.graveyard),
                ("shed", snap.shed),
                ("uncertain", snap.uncertain),
            ),
        ),
        _labelled(
            pending, (("main", snap.main_depth), ("dlq", snap.dlq_depth), ("in_flight", snap.in_flight))
        ),
    ]


def _attempt_families(snap: Snapshot) -> list[Metric]:
    """Attempts: sent, answered or given up, retried, and why the failed ones failed."""
    attempts = _counter("ratedeck_attempts", "Attempts answered or given up, by outcome.", None, ("outcome",))
    failures = _counter(
        "ratedeck_failures", "Failed attempts (5xx, timeouts, no answer) by cause.", None, ("cause",)
    )
    errors = _counter(
        "ratedeck_errors",
        "Attempts that did not succeed, by HTTP status and cause.",
        None,
        ("status", "cause"),
    )
    return [
        _counter("ratedeck_attempts_sent", "Attempts sent (a retried request once per attempt).", snap.sent),
        _labelled(
            attempts,
            (
                ("succeeded", snap.succeeded),
                ("rejected_429", snap.rejected_429),
                ("rejected_other", snap.rejected_other),
                ("failed", snap.failed),
            ),
        ),
        _counter("ratedeck_retries", "Attempts queued again for a retry.", snap.retried),
        _labelled(failures, snap.failures),
        _labelled(
            errors,
            ((("none" if e.status is None else str(e.status), e.cause), e.count) for e in snap.errors),
        ),
    ]


def _key_families(snap: Snapshot) -> list[Metric]:
    """Per key; the labels are key ids, never secrets. In a pool of endpoints every series also
    has an `endpoint` label, the key's endpoint's name; with one target there is no such label,
    so a run with one target scrapes exactly as before (dashboards and alerts keep matching)."""
    pool = bool(snap.endpoints)
    ep: tuple[str, ...] = ("endpoint",) if pool else ()
    key_sent = _counter("ratedeck_key_attempts_sent", "Attempts sent with each key.", None, ("key", *ep))
    key_attempts = _counter(
        "ratedeck_key_attempts",
        "Attempts of each key by outcome (error: any other failure).",
        None,
        ("key", "outcome", *ep),
    )
    key_in_flight = GaugeMetricFamily(
        "ratedeck_key_in_flight", "Attempts in flight per key.", labels=["key", *ep]
    )
    window_used = GaugeMetricFamily(
        "ratedeck_key_window_used", "Sends in the key's tightest window now.", labels=["key", *ep]
    )
    window_limit = GaugeMetricFamily(
        "ratedeck_key_window_limit", "The key's tightest window's limit.", labels=["key", *ep]
    )
    window_ratio = GaugeMetricFamily(
        "ratedeck_key_window_use_ratio", "window_used / window_limit per key (0..1).", labels=["key", *ep]
    )
    key_state = GaugeMetricFamily(
        "ratedeck_key_state",
        "The key's current state (active, paused, cooling, blocked): one series per key, value 1.",
        labels=["key", "state", *ep],
    )
    estimate = GaugeMetricFamily(
        "ratedeck_key_limit_estimate",
        "The key's limit as estimated now (requests per window): why (told, advertised, lowered by "
        "a 429 at N, climbing, climbed back) and how it climbs (additive, probing) as labels.",
        labels=["key", "window", "reason", "climb", *ep],
    )
    estimate_moved = GaugeMetricFamily(
        "ratedeck_key_limit_estimate_moved_seconds_ago",
        "Seconds since the key's limit estimate last moved (absent while it never did).",
        labels=["key", *ep],
    )
    shared = GaugeMetricFamily(
        "ratedeck_key_shared_ratio",
        "Share of the key's last counted window someone else used (the server's count against "
        "our sends); absent while none was seen.",
        labels=["key", *ep],
    )
    for k in snap.keys:
        e = (k.endpoint,) if pool else ()
        if k.limit_estimate:
            limit, _, window = k.limit_estimate.partition("/")
            estimate.add_metric([k.label, window, k.estimate_reason, k.estimate_climb, *e], float(limit))
        if k.estimate_moved_ago_s is not None:
            estimate_moved.add_metric([k.label, *e], k.estimate_moved_ago_s)
        if k.shared_share is not None:
            shared.add_metric([k.label, *e], k.shared_share)
        key_sent.add_metric([k.label, *e], k.sent)
        key_attempts.add_metric([k.label, "succeeded", *e], k.succeeded)
        key_attempts.add_metric([k.label, "rejected_429", *e], k.rejected_429)
        key_attempts.add_metric([k.label, "error", *e], max(0, k.errors - k.rejected_429))
        key_in_flight.add_metric([k.label, *e], k.in_flight)
        window_used.add_metric([k.label, *e], k.window_used)
        window_limit.add_metric([k.label, *e], k.window_limit)
        window_ratio.add_metric([k.label, *e], k.window_used / k.window_limit if k.window_limit else 0.0)
        key_state.add_metric([k.label, str(k.state), *e], 1.0)
    return [
        key_sent,
        key_attempts,
        key_in_flight,
        window_used,
        window_limit,
        window_ratio,
        key_state,
        estimate,
        estimate_moved,
        shared,
    ]


def _gate_families(snap: Snapshot) -> list[Metric]:
    """The cooldown gates: one per key, and "host"."""
    gate_open = GaugeMetricFamily(
        "ratedeck_gate_open", "1 when the cooldown gate is open, 0 when closed.", labels=["gate"]
    )
    gate_left = GaugeMetricFamily(
        "ratedeck_gate_seconds_left", "Seconds until the cooldown gate opens (0: open).", labels=["gate"]
    )
    gate_closures = _counter("ratedeck_gate_closures", "Times each cooldown gate closed.", None, ("gate",))
    gate_escalations = _counter(
        "ratedeck_gate_escalations",
        "Gate closings that asked for a longer wait than the one before.",
        None,
        ("gate",),
    )
    for g in snap.gates:
        gate_open.add_metric([g.name], 0.0 if g.left_s > 0 else 1.0)
        gate_left.add_metric([g.name], g.left_s)
        gate_closures.add_metric([g.name], g.closures)
        gate_escalations.add_metric([g.name], g.escalations)
    return [gate_open, gate_left, gate_closures, gate_escalations]


def _run_families(snap: Snapshot) -> list[Metric]:
    """Rates, capacity, the live settings, the queues, and the client's own cost."""
    depth = GaugeMetricFamily(
        "ratedeck_queue_depth", "Requests waiting, by queue (main, dlq).", labels=["queue"]
    )
    phase = GaugeMetricFamily("ratedeck_phase", "1 for the run's current phase.", labels=["phase"])
    lag_p50, lag_p99, client_limit = snap.lag.shown(snap.phase == Phase.STOPPED)
    return [
        _gauge(
            "ratedeck_capacity_rps",
            "Requests per second every key's limits allow together.",
            snap.capacity_tps,
        ),
        _gauge(
            "ratedeck_live_capacity_rps",
            "Requests per second the keys that can send now allow, headroom included.",
            snap.live_capacity_tps,
        ),
        _gauge("ratedeck_throughput_rps", "Successes per second since the start.", snap.throughput_tps),
        _gauge("ratedeck_current_throughput_rps", "Successes in the last full second.", snap.current_tps),
        _gauge("ratedeck_arrival_rate_rps", "The workload's arrival rate.", snap.arrival_rate),
        _gauge("ratedeck_headroom_seconds", "Margin added to every window.", _seconds(snap.headroom_ms)),
        _gauge(
            "ratedeck_headroom_adaptive",
            "1 when the headroom is learned, 0 when fixed.",
            float(snap.headroom_adaptive),
        ),
        _gauge("ratedeck_backpressure", "1 when backpressure is on.", float(snap.backpressure)),
        _gauge("ratedeck_queue_max", "Main queue size with backpressure on.", snap.main_max),
        _labelled(depth, (("main", snap.main_depth), ("dlq", snap.dlq_depth))),
        _gauge("ratedeck_in_flight", "Attempts in flight.", snap.in_flight),
        _gauge("ratedeck_elapsed_seconds", "Seconds since the run started.", snap.elapsed_s),
        _labelled(phase, ((str(snap.phase), 1.0),)),
        # the client's own cost: is ratedeck the bottleneck? (rate(cpu)/processes near 1: yes)
        _counter(
            "ratedeck_client_cpu_seconds",
            "CPU seconds of the engine's processes since the start.",
            snap.cpu_s,
        ),
        _gauge("ratedeck_client_processes", "Engine processes (--procs).", snap.procs),
        _gauge(
            "ratedeck_loop_lag_seconds",
            "How late the engine's timers fired, worst of the last seconds.",
            _seconds(snap.loop_lag_ms),
        ),
        _gauge(
            "ratedeck_loop_lag_p50_seconds",
            "Median lateness of the engine's ticker over the last minute (the run's once stopped).",
            _seconds(lag_p50),
        ),
        _gauge(
            "ratedeck_loop_lag_p99_seconds",
            "99th percentile lateness of the engine's ticker over the last minute (the run's once stopped).",
            _seconds(lag_p99),
        ),
        _gauge(
            "ratedeck_client_is_the_limit",
            "1 when the client, not the server, is the limit (loop lag p99 or a busy core).",
            1.0 if client_limit else 0.0,
        ),
    ]


def _job_families(snap: Snapshot) -> list[Metric]:
    """A job of known size: its size, what is done, the time left; none for endless work. An
    unknown time left is left out (a gauge has no "unknown")."""
    p = snap.progress
    if p is None:
        return []
    out: list[Metric] = [
        _gauge(
            "ratedeck_job_size",
            "Requests the job holds in all (a file's lines, a store's pending jobs).",
            p.total,
        ),
        _gauge("ratedeck_job_done", "Requests of the job that ended, in any place.", p.done),
    ]
    if p.eta_s is not None:
        out.append(
            _gauge(
                "ratedeck_job_eta_seconds", "Seconds until the job's last request ends (estimate).", p.eta_s
            )
        )
    if p.least_s is not None:
        out.append(
            _gauge(
                "ratedeck_job_least_seconds",
                "The least seconds the limits in force allow for what remains of the job.",
                p.least_s,
            )
        )
    return out


#: The latency histograms: name, the snapshot's attribute, help.
HISTOGRAMS = (
    ("ratedeck_latency_seconds", "latency", "Send -> answer latency of successful requests."),
    (
        "ratedeck_latency_total_seconds",
        "latency_total",
        "Arrival (intended arrival at a fixed rate) -> done latency of successful requests.",
    ),
    ("ratedeck_queue_wait_seconds", "queue_wait", "Arrival -> first send, every request sent."),
)


def _spend_families(snap: Snapshot) -> list[Metric]:
    """LLM spend from the answers' usage, per model and key (a model with no price has no sample:
    its spend is unknown, not 0), and the --max-cost cap with what is reserved under it."""
    spend = snap.spend
    if spend is None:
        return []
    pool = bool(snap.endpoints)  # a pool of endpoints: the key's endpoint as a label too
    endpoint_of = {k.label: k.endpoint for k in snap.keys}
    cost = _counter(
        "ratedeck_cost_usd", "US dollars the answers cost, from their usage at the model's price.", None,
        ("model", "key", *(("endpoint",) if pool else ())),
    )  # fmt: skip
    for r in spend.rows:
        if r.usd is not None:
            cost.add_metric([r.model, r.key, *((endpoint_of.get(r.key, ""),) if pool else ())], r.usd)
    families: list[Metric] = [cost]
    if spend.cap_usd is not None:
        families.append(_gauge("ratedeck_cost_cap_usd", "The --max-cost cap in US dollars.", spend.cap_usd))
        families.append(
            _gauge(
                "ratedeck_cost_reserved_usd",
                "US dollars the requests admitted and not ended may still cost (their estimate's ceiling).",
                spend.reserved_usd,
            )
        )
    return families


def _endpoint_families(snap: Snapshot) -> list[Metric]:
    """A pool of endpoints ([[endpoints]]): whether each is in the pool, how often it left it, and
    each model's limits there as its keys hold them (none with one target)."""
    if not snap.endpoints:
        return []
    up = GaugeMetricFamily(
        "ratedeck_endpoint_up",
        "1 while the endpoint is in the pool, 0 while it is out of it (down, or one probe out to see).",
        labels=["endpoint"],
    )
    downs = _counter(
        "ratedeck_endpoint_downs",
        "Times the endpoint left the pool (a run of failures).",
        None,
        ("endpoint",),
    )
    limit = GaugeMetricFamily(
        "ratedeck_endpoint_model_limit_per_minute",
        "Each model's limit per minute at the endpoint, per unit (requests, tokens, ...), summed over "
        "its keys: told, the preset's, or learned from the answers' headers.",
        labels=["endpoint", "model", "unit"],
    )
    for e in snap.endpoints:
        up.add_metric([e.name], 1.0 if e.state == "up" else 0.0)
        downs.add_metric([e.name], e.downs)
        for m in e.models:
            for unit, per_min in m.limits:
                limit.add_metric([e.name, m.model, unit], per_min)
    return [up, downs, limit]


def _latency_families(snap: Snapshot, buckets: dict[str, Buckets]) -> list[Metric]:
    """Latency: the engine's own quantiles, and histograms in seconds."""
    quantiles = GaugeMetricFamily(
        "ratedeck_latency_quantile_seconds",
        "Latency quantiles since the start (quantile 1 is the maximum), by stage: send_answer (send -> "
        "answer), arrival_done (arrival -> done), queue_wait (arrival -> first send).",
        labels=["stage", "quantile"],
    )
    for stage, attr in STAGES:
        lat: LatencySummary = getattr(snap, attr)
        for q, name in QUANTILES:
            quantiles.add_metric([stage, q], _seconds(getattr(lat, name)))
    out: list[Metric] = [quantiles]
    for name, attr, doc in HISTOGRAMS:
        lat = getattr(snap, attr)
        edges = buckets.get(attr) or lat.buckets  # the snapshot carries them (a console run's child too)
        rows = [(f"{_seconds(edge):g}", count) for edge, count in edges] + [("+Inf", lat.count)]
        out.append(HistogramMetricFamily(name, doc, buckets=rows, sum_value=_seconds(lat.mean * lat.count)))
    return out


def _message_families(snap: Snapshot) -> list[Metric]:
    """A message run's own accounting; none for other runs."""
    m = snap.messages
    if m is None:
        return []
    msgs = _counter("ratedeck_messages", "Messages that ended, by outcome.", None, ("outcome",))
    waiting = GaugeMetricFamily("ratedeck_messages_pending", "Messages not ended yet.", labels=["where"])
    return [
        _counter("ratedeck_messages_generated", "Messages arrived at the entry.", m.generated),
        _labelled(msgs, (("completed", m.completed), ("failed", m.failed), ("shed", m.shed))),
        _labelled(waiting, (("queued", m.queued), ("in_progress", m.in_progress))),
        _gauge(
            "ratedeck_message_goodput_rps", "Messages completed per second since the start.", m.goodput_tps
        ),
    ]


def client_families(c: ClientView) -> list[Metric]:
    """The gateway's clients: answers by status, the queue-wait histogram, clients waiting now."""
    answers = _counter(
        "ratedeck_gateway_requests",
        "Gateway answers to clients, by HTTP status (499: the client left first).",
        None,
        ("status",),
    )
    for status, count in c.statuses:
        answers.add_metric([str(status)], count)
    rows = [(f"{edge:g}", count) for edge, count in c.wait_buckets] + [("+Inf", c.wait_count)]
    wait = HistogramMetricFamily(
        "ratedeck_gateway_queue_wait_seconds",
        "Gateway requests: arrival -> first send (or -> the end, for one never sent).",
        buckets=rows,
        sum_value=c.wait_sum_s,
    )
    waiting = GaugeMetricFamily(
        "ratedeck_gateway_clients_waiting", "Gateway requests queued for the limits now.", value=c.waiting
    )
    return [answers, wait, waiting, *client_row_families(c), *batch_families(c)]


def client_row_families(c: ClientView) -> list[Metric]:
    """Each named gateway client (`[[gateway.clients]]`), labelled `client`: its requests waiting,
    its queue-wait quantiles, its share of the binding unit and what it was served of it, each
    quota's limit and what is left, and the requests its quota refused. None with one token."""
    if not c.rows:
        return []
    waiting = GaugeMetricFamily(
        "ratedeck_gateway_client_waiting",
        "The client's requests queued for the limits now.",
        labels=["client"],
    )
    wait = GaugeMetricFamily(
        "ratedeck_gateway_client_queue_wait_quantile_seconds",
        "The client's queue waits (arrival -> first send) over its latest requests, by quantile.",
        labels=["client", "quantile"],
    )
    share = GaugeMetricFamily(
        "ratedeck_gateway_client_share",
        "The client's share (0 to 1) of the binding unit served to all clients over the last 60 s.",
        labels=["client", "unit"],
    )
    served = _counter(
        "ratedeck_gateway_client_served",
        "Binding units (tokens, weight or requests: `unit`) served to the client since the start.",
        None,
        ("client", "unit"),
    )
    refused = _counter(
        "ratedeck_gateway_client_refused",
        'The client\'s requests refused past a quota (quota = "refuse": 429 and Retry-After).',
        None,
        ("client",),
    )
    left = GaugeMetricFamily(
        "ratedeck_gateway_client_quota_left",
        "What is left of the client's quota over its window (60 s; usd_per_day: 24 h).",
        labels=["client", "quota"],
    )
    limit = GaugeMetricFamily(
        "ratedeck_gateway_client_quota_limit",
        "The client's quota over its window (60 s; usd_per_day: 24 h).",
        labels=["client", "quota"],
    )
    for r in c.rows:
        waiting.add_metric([r.name], r.waiting)
        wait.add_metric([r.name, "0.5"], _seconds(r.wait_p50_ms))
        wait.add_metric([r.name, "0.99"], _seconds(r.wait_p99_ms))
        share.add_metric([r.name, c.unit], r.share)
        served.add_metric([r.name, c.unit], r.served)
        refused.add_metric([r.name], r.refused)
        for q in r.quotas:
            left.add_metric([r.name, q.name], q.left)
            limit.add_metric([r.name, q.name], q.limit)
    return [waiting, wait, share, served, refused, left, limit]


#: Every status a batch of the Batch APIs can have (OpenAI's names), each a series of
#: ratedeck_gateway_batches even at 0.
BATCH_STATUSES = (*UNFINISHED, *FINAL)


def batch_families(c: ClientView) -> list[Metric]:
    """The gateway's batches (the Batch APIs): how many by status (every status, 0 when none
    has it), lines left in the batches not final, and each such batch's ETA, labelled `batch`
    (its id; one with no rate yet has no sample: unknown, not 0). None until a batch is made."""
    if not c.batches:
        return []
    by_status = dict.fromkeys(BATCH_STATUSES, 0)
    for b in c.batches:
        by_status[b.status] = by_status.get(b.status, 0) + 1
    live = [b for b in c.batches if b.status not in FINAL]
    batches = _labelled(
        GaugeMetricFamily(
            "ratedeck_gateway_batches",
            "Gateway batches (Batch APIs) by status: those not final and the latest 10 final.",
            labels=["status"],
        ),
        by_status.items(),
    )
    left = _gauge(
        "ratedeck_gateway_batch_lines_left",
        "Lines not yet ended in the gateway's batches that are not final.",
        sum(b.left for b in live),
    )
    eta = _labelled(
        GaugeMetricFamily(
            "ratedeck_gateway_batch_eta_seconds",
            "Seconds until a batch not final ends its lines, at the rate its latest lines ended.",
            labels=["batch"],
        ),
        ((b.id, b.eta_s) for b in live if b.eta_s is not None),
    )
    return [batches, left, eta]


# ---------------------------------------------------------------- serving


class MetricsServer:
    """/metrics on HOST:PORT in a daemon thread (prometheus_client's own HTTP server)."""

    def __init__(self, server: Any, thread: threading.Thread, host: str, collector: SnapshotCollector):
        self.collector = collector
        self._server = server
        self._thread = thread
        self.host = host
        self.port: int = server.server_port

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)


class MetricsPortError(OSError):
    """The metrics port cannot be listened on; the message is one line for the user."""


def serve_metrics(source: Callable[[], Scrape], port: int, host: str = "127.0.0.1") -> MetricsServer:
    """Serve `source()`'s scrapes at http://host:port/metrics; port 0 picks a free one.

    Raises MetricsPortError (one line) when the address cannot be used.
    """
    from prometheus_client import start_http_server

    registry = CollectorRegistry(auto_describe=False)
    collector = SnapshotCollector(source)
    registry.register(collector)
    try:
        server, thread = start_http_server(port, addr=host, registry=registry)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            why = "the port is in use (another ratedeck or exporter?); pick another or 0 for any free port"
        elif exc.errno == errno.EACCES:
            why = "permission denied (ports below 1024 need privileges)"
        else:
            why = exc.strerror or str(exc)
        raise MetricsPortError(f"--metrics-port {port}: cannot listen on {host}:{port}: {why}") from None
    return MetricsServer(server, thread, host, collector)
