"""`ratedeck --no-ui`: periodic metrics on stdout, a final summary, report and plots.

Exit codes are `ExitCode` (core/exits.py; docs/exit-codes.md lists them), the
same for the console (`ratedeck` without --no-ui). `conclude` gathers every one
that applies to a run and returns the first by `exits.ORDER`. A malformed
threshold, an unknown report field in one, or a metrics port that cannot be
listened on is bad input (`ExitCode.USAGE`) before the run.

Signals: the first SIGINT, SIGTERM or SIGHUP stops generating and drains
(in-flight requests finish, bounded by engine.drain_timeout_s), then prints
the summary and writes the report; a second one stops the drain at once and
still reports, what is left counted as queued or in flight.

A target that never answers is not waited on forever: with no answer at
all after `DEAD_TARGET_S` seconds and `DEAD_TARGET_ATTEMPTS` attempts in a
row without one (whichever comes later), the run stops and says why.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from ratedeck.config import ConfigError, RunConfig, with_graveyard_place
from ratedeck.core.exits import ExitCode, first_of
from ratedeck.core.numbers import readable
from ratedeck.core.secrets import Redactor
from ratedeck.core.vocab import Phase
from ratedeck.engine.settings import GRAVEYARD_AUTO
from ratedeck.engine.snapshot import (
    BatchRow,
    BudgetRow,
    ClientRow,
    ClientView,
    ClusterView,
    EndpointRow,
    Event,
    KeyRow,
    LatencySummary,
    Makespan,
    Progress,
    Snapshot,
)
from ratedeck.gateway.batches.records import FINAL, UNFINISHED
from ratedeck.host.session import RunFacts, Session
from ratedeck.runner.client_cost import client_lines
from ratedeck.runner.money import cap_line, spend_lines
from ratedeck.runner.report import build_report, ended, write_report
from ratedeck.runner.thresholds import Threshold, evaluate
from ratedeck.store.work import StoreReport

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from ratedeck.runner.prometheus import LoopSource, MetricsServer

DEAD_TARGET_S = 10.0
DEAD_TARGET_ATTEMPTS = 50
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_TICK_S = 0.25  # how often the run loop looks at the deadline, the target and signals


def _latency(name: str, lat: LatencySummary) -> str:
    return (
        f"{name:<13} mean {lat.mean:.1f}  p50 {lat.p50:.1f}  p90 {lat.p90:.1f}  p99 {lat.p99:.1f}"
        f"  p99.9 {lat.p999:.1f}  max {lat.max:.1f}"
    )


def _capacity(tps: float) -> str:
    """The keys' capacity as the start line says it; none given: the server's answers tell it."""
    return (
        f"capacity {readable(tps)} req/s"
        if tps
        else "capacity from the server's first answers (no limit given)"
    )


def _keys(n: int) -> str:
    return f"{n} key" if n == 1 else f"{n} keys"


def metrics_block(snap: Snapshot) -> list[str]:
    """The periodic block: throughput, requests, queues, latency (send -> answer, arrival ->
    done, queue wait), headroom."""
    mode = "adaptive" if snap.headroom_adaptive else "fixed"
    lines = [
        f"--- ratedeck metrics at {snap.elapsed_s:7.1f} s ---",
        *([progress_line(snap.progress, snap.phase == Phase.STOPPED)] if snap.progress is not None else []),
        f"throughput   {snap.throughput_tps:8.2f} req/s average, {snap.current_tps:.0f} in the last second"
        + (
            f"  ({snap.pct_capacity:.1f}% of {readable(snap.capacity_tps)}/s capacity"
            + (
                ": the burst the limits allow at the start, on top of their steady rate)"
                if snap.pct_capacity > 101
                else ")"
            )
            if snap.capacity_tps
            else "  (capacity not known yet: no limit given, none advertised)"
        ),
        f"requests     generated {snap.generated}  succeeded {snap.succeeded}  expired {snap.expired}"
        f"  graveyard {snap.graveyard}  shed {snap.shed}"
        + (f"  uncertain {snap.uncertain}" if snap.uncertain else ""),
        f"attempts     sent {snap.sent}  rejected 429 {snap.rejected_429}  rejected other {snap.rejected_other}"
        f"  failed {snap.failed}  retried {snap.retried}",
        f"queues       main {snap.main_depth} (avg {snap.main_avg:.1f}, max {snap.main_peak})"
        f"  dlq {snap.dlq_depth} (avg {snap.dlq_avg:.1f}, max {snap.dlq_peak})  in flight {snap.in_flight}",
        f"latency ms   {_latency('send->answer', snap.latency)}",
        f"             {_latency('arrival->done', snap.latency_total)}",
        f"             {_latency('queue wait', snap.queue_wait)}",
        f"headroom     {snap.headroom_ms:.1f} ms {mode}  backpressure {'on' if snap.backpressure else 'off'}"
        + ("  fed as fast as the limits allow" if snap.fed else f"  arrival {readable(snap.arrival_rate)}/s"),
        f"             from {snap.headroom_from()}"
        + (f"; spread {spread}" if (spread := snap.headroom_spread()) else ""),
    ]
    lines += client_lines(snap)
    lines += token_lines(snap)
    if snap.spend is not None:
        lines.append(f"spend        {snap.spend.line()}")
    if snap.clients is not None:
        lines.append(clients_line(snap.clients))
        lines += client_row_lines(snap.clients)
        lines += batch_lines(snap.clients.batches)
    lines += endpoint_lines(snap.endpoints)
    return lines


def endpoint_line(e: EndpointRow) -> str:
    """One endpoint of a pool: "east (azure-openai) up  keys 1  sent 40  ok 40  429 0  gpt-4o-mini:
    requests 120/min, tokens 20,000/min", with why it is out of the pool when it is."""
    state = e.state if not e.reason else f"{e.state} ({e.reason})"
    downs = f", out {e.downs}x" if e.downs else ""
    limits = e.limits_text() or ("serves any model" if e.serves == ("any",) else "")
    return (
        f"{e.name} ({e.preset}) {state}{downs}  keys {e.keys}  sent {e.sent}  ok {e.succeeded}"
        f"  429 {e.rejected_429}" + (f"  {limits}" if limits else "")
    )


def endpoint_lines(endpoints: tuple[EndpointRow, ...]) -> list[str]:
    """The pool's endpoints, one line each ([] with one target)."""
    return [f"{'endpoints' if i == 0 else '':<13}{endpoint_line(e)}" for i, e in enumerate(endpoints)]


def is_endpoint_event(e: Event) -> bool:
    """An endpoint leaving or coming back to the pool (engine/path/health.py)."""
    return e.text.startswith("endpoint ") and ("out of the pool" in e.text or "back in the pool" in e.text)


class EndpointEvents:
    """The endpoint events (`is_endpoint_event`) of an event log not printed yet: `new(rows)`
    gives those after the last one it saw (the log keeps its last few hundred, newest last)."""

    __slots__ = ("last",)

    def __init__(self) -> None:
        self.last: Event | None = None

    def new(self, rows: Iterable[Event]) -> list[Event]:
        rows = list(rows)
        start = 0
        if self.last is not None:
            for i in range(len(rows) - 1, -1, -1):
                if rows[i] == self.last:
                    start = i + 1
                    break
        if rows:
            self.last = rows[-1]
        return [e for e in rows[start:] if is_endpoint_event(e)]


def progress_line(p: Progress, stopped: bool = False) -> str:
    """A job of known size: "jobs  1,234 of 3,000 (41%)  ETA 2m10s  least 2m02s" (`Progress`:
    the ETA and the least time the limits allow for what remains); a job done says no ETA, a
    run `stopped` before the end what it left."""
    line = f"jobs  {p.done:,} of {p.total:,} ({math.floor(100 * p.fraction)}%)"
    if p.remaining == 0:
        return line
    if stopped:
        return f"{line}  {p.remaining:,} left"
    line += f"  ETA {eta_text(p.eta_s)}"
    if p.least_s is not None:
        line += f"  least {eta_text(p.least_s)}"
    return line


def eta_text(seconds: float | None) -> str:
    """A time left as "45s", "2m10s" or "3h05m"; "unknown" when it is not known yet."""
    if seconds is None or not math.isfinite(seconds):
        return "unknown"
    whole = max(0, math.ceil(seconds))
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    hours, minutes = divmod(math.ceil(whole / 60), 60)
    return f"{hours}h{minutes:02d}m"


def clients_line(c: ClientView) -> str:
    """The gateway's clients: "clients      waiting 3  queue wait p50 12 ms p99 840 ms  answers HTTP 200 x41"."""
    answers = _counts((f"HTTP {s}" if s != 499 else "left first", n) for s, n in c.statuses) or "none yet"
    return (
        f"clients      waiting {c.waiting}  queue wait p50 {c.wait_p50_ms:.0f} ms p99 {c.wait_p99_ms:.0f} ms"
        f"  answers {answers}"
    )


def client_row_lines(c: ClientView) -> list[str]:
    """One line per named gateway client (`[[gateway.clients]]`; none with one token), under the
    clients' line: "             nightly  batch  waiting 37  wait p50 2400 ms p99 31.0 s  share 34% of
    tokens  tokens_per_minute 8% left (8,000 of 100,000)  refused 4"."""
    if not c.rows:
        return []
    name_w = max(len(r.name) for r in c.rows)
    prio_w = max(len(_priority(r)) for r in c.rows)
    lines = []
    for r in c.rows:
        wait = f"wait p50 {_wait(r.wait_p50_ms)} p99 {_wait(r.wait_p99_ms)}" if r.sent else "wait none yet"
        parts = [
            f"{'':13}{r.name:<{name_w}}  {_priority(r):<{prio_w}}  waiting {r.waiting}  {wait}",
            f"share {r.share * 100:.0f}% of {c.unit}",
            *(_quota(q.name, q.limit, q.left) for q in r.quotas),
        ]
        if r.refused:
            parts.append(f"refused {r.refused}")
        lines.append("  ".join(parts))
    return lines


def batch_lines(batches: tuple[BatchRow, ...]) -> list[str]:
    """The gateway's batches (the Batch APIs; [] with none): "batches      2 in progress,
    1 completed; 340 lines left, eta 1m20s" (lines left and the ETA, the latest of those known,
    count the batches not final), then one line per batch not final: "             batch_6a1f...
    openai  nightly  in_progress  260 of 600  failed 2  eta 1m20s"."""
    if not batches:
        return []
    counts: dict[str, int] = {}
    for b in batches:
        counts[b.status] = counts.get(b.status, 0) + 1
    order = [s for s in (*UNFINISHED, *FINAL) if s in counts] + sorted(set(counts) - {*UNFINISHED, *FINAL})
    line = "batches      " + ", ".join(f"{counts[s]} {s.replace('_', ' ')}" for s in order)
    live = [b for b in batches if b.status not in FINAL]
    if not live:
        return [line]
    left = sum(b.left for b in live)
    known = [b.eta_s for b in live if b.eta_s is not None]
    lines = [
        f"{line}; {left:,} line{'' if left == 1 else 's'} left, eta {eta_text(max(known) if known else None)}"
    ]
    id_w = max(len(b.id) for b in live)
    api_w = max(len(b.api) for b in live)
    client_w = max(len(b.client) for b in live)
    status_w = max(len(b.status) for b in live)
    for b in live:
        parts = [
            f"{'':13}{b.id:<{id_w}}  {b.api:<{api_w}}  {b.client:<{client_w}}  {b.status:<{status_w}}",
            f"{b.done:,} of {b.total:,}",
            *([f"failed {b.failed:,}"] if b.failed else []),
            f"eta {eta_text(b.eta_s)}",
        ]
        lines.append("  ".join(parts))
    return lines


def _priority(r: ClientRow) -> str:
    return r.priority if r.weight == 1 else f"{r.priority} x{r.weight:g}"


def _wait(ms: float) -> str:
    return f"{ms:.0f} ms" if ms < 10_000 else f"{ms / 1000:.1f} s"


def _quota(name: str, limit: float, left: float) -> str:
    """ "tokens_per_minute 8% left (8,000 of 100,000)"; USD with cents."""
    pct = 100 * left / limit if limit > 0 else 0.0
    amount = (lambda x: f"${x:,.2f}") if name.startswith("usd") else (lambda x: f"{x:,.0f}")
    return f"{name} {pct:.0f}% left ({amount(left)} of {amount(limit)})"


TOKEN_UNITS = ("tokens", "input_tokens", "output_tokens")


def token_budgets(snap: Snapshot) -> list[BudgetRow]:
    """The run's token budgets (per key and host-wide), in the snapshot's order; [] for most runs."""
    return [b for b in snap.budgets if b.unit in TOKEN_UNITS]


#: A run shorter than this says what it settled in its time, not a rate per minute: a budget's
#: limit is per minute, and a full bucket lets a minute's worth go at once, so a rate from a
#: few seconds (a job that ended at once) would read as many times the limit.
RATE_AFTER_S = 60.0


def _settled(settled: int, elapsed_s: float, over_the_run: str = "") -> str:
    """ "N settled = R/min{over_the_run}" once a minute has passed, else "N settled in T"."""
    if elapsed_s >= RATE_AFTER_S:
        return f"{settled:,} settled = {settled * 60.0 / elapsed_s:,.0f}/min{over_the_run}"
    took = f"{elapsed_s * 1000:.0f} ms" if elapsed_s < 1 else f"{elapsed_s:.1f} s"
    return f"{settled:,} settled in {took}"


def _limit(per_min: float | None) -> str:
    return "limit not learned yet" if per_min is None else f"limit {per_min:,.0f}/min"


def token_lines(snap: Snapshot) -> list[str]:
    """The periodic block's token lines (none without token budgets): per budget name, what the
    keys reserved and settled together, at what rate over the run against what their limits
    allow together now, and which unit binds the keys now ("binds now: tokens x3  requests x1";
    a key refused for good counts as "out")."""
    budgets = token_budgets(snap)
    if not budgets:
        return []
    out = {k.label for k in snap.keys if k.state == "blocked"}
    names: dict[str, list[BudgetRow]] = {}
    for b in budgets:
        names.setdefault(b.name, []).append(b)
    parts = []
    for name, rows in names.items():
        settled = sum(b.settled for b in rows)
        # what the budgets that can still be spent allow together (a key refused for good, none)
        limits = [b.per_min for b in rows if b.per_min is not None and b.owner not in out]
        parts.append(
            f"{name} ({_budget_owners(rows, snap)}): {sum(b.reserved for b in rows):,} reserved, "
            f"{_settled(settled, snap.elapsed_s)}, {_limit(sum(limits) if limits else None)}"
        )
    binds: dict[str, int] = {}
    for k in snap.keys:
        if k.state == "blocked":
            binds["out"] = binds.get("out", 0) + 1
        elif k.binding:
            binds[k.binding] = binds.get(k.binding, 0) + 1
    lines = [f"tokens       {'; '.join(parts)}"]
    if binds:
        lines.append(f"             binds now: {_counts(binds.items())}")
    return lines


def _budget_owners(rows: list[BudgetRow], snap: Snapshot) -> str:
    """Who a budget's rows belong to, each count naming what it counts: "host", "2 keys", or
    "2 keys, 3 budgets" where a key has one per model (a row's owner: "host", "k1" or "k1 gpt-4o")."""
    labels = sorted((k.label for k in snap.keys), key=len, reverse=True)  # "k10" before "k1"
    host = any(b.owner == "host" for b in rows)
    keys = {
        next((label for label in labels if b.owner == label or b.owner.startswith(label + " ")), b.owner)
        for b in rows
        if b.owner != "host"
    }
    parts = ["host"] if host else []
    if keys:
        parts.append(f"{len(keys)} key{'' if len(keys) == 1 else 's'}")
    if len(rows) > host + len(keys):  # more budgets than owners: a key's own per model
        parts.append(f"{len(rows)} budgets")
    return ", ".join(parts)


def token_key_lines(snap: Snapshot) -> list[str]:
    """The summary's line per key and token budget: "k1 tokens: 412,300 reserved, 398,100 settled
    = 29,129/min over the run, limit 30,000/min (binds now: tokens)"; the rate is what settled
    over the run's elapsed time (under a minute, what settled and in how long: `RATE_AFTER_S`),
    the limit what the budget allows now. A key refused for good says it is out."""
    keys = {k.label: k for k in snap.keys}
    lines = []
    for b in token_budgets(snap):
        line = (
            f"  {b.owner:>4} {b.name}: {b.reserved:,} reserved, "
            f"{_settled(b.settled, snap.elapsed_s, ' over the run')}, {_limit(b.per_min)}"
        )
        k = keys.get(b.owner)
        if k is not None and k.state == "blocked":
            line += " (out of quota)" if out_of_quota(k) else " (refused, not used)"
        elif k is not None and k.binding:
            line += f" (binds now: {k.binding})"
        lines.append(line)
    return lines


def _counts(pairs) -> str:
    return "  ".join(f"{name} x{count}" for name, count in pairs)


def summary_lines(snap: Snapshot, facts: RunFacts | None = None) -> list[str]:
    """The final summary, including where every request ended and what the target answered."""
    queued = snap.main_depth + snap.dlq_depth
    lines = ["", "=== ratedeck final summary ==="] + metrics_block(snap)[1:]
    if snap.failures:
        lines.append(f"failures     {_counts(snap.failures)}")
    if facts is not None:
        if facts.statuses:
            lines.append(f"answers      {_counts((f'HTTP {s}', n) for s, n in facts.statuses)}")
        if facts.no_answer:
            lines.append(f"no answer    {_counts(facts.no_answer)}")
        for text, count in facts.redirects:
            lines.append(f"redirects    {text} x{count}")
        if facts.retried:
            lines.append(
                f"resent       {facts.retried} on a new connection (a kept-alive one closed under them)"
            )
    lines.append(
        f"accounting   {snap.generated} generated = {snap.succeeded} succeeded"
        + (f" + {snap.uncertain} uncertain" if snap.uncertain else "")
        + f" + {snap.expired} expired"
        f" + {snap.graveyard} graveyard + {snap.shed} shed + {queued} queued + {snap.in_flight} in flight"
        + ("" if snap.balance() == 0 else f"  (MISMATCH {snap.balance()})")
    )
    if facts is not None and facts.store is not None:
        lines += store_lines(facts.store)
    if snap.cluster is not None:
        lines.append(cluster_summary_line(snap.cluster))
    if snap.makespan is not None:
        lines.append(makespan_line(snap.makespan))
    refused = refused_keys(snap)
    if refused:
        lines.append(
            f"refused      {len(refused)} of {len(snap.keys)} keys, not used again: "
            + "; ".join(f"{key_name(k)} {refusal(k)}" for k in refused)
        )
    for k in snap.keys:
        out = out_of_quota(k)  # refusal() then says "out of quota (...)" itself
        lines.append(
            f"  {k.label:>4} {k.masked}  {'out' if out else k.state:<8} sent {k.sent:>7}  ok {k.succeeded:>7}  429 {k.rejected_429}"
            + (f"  told {k.told_limit}, learned {k.learned_limit}" if k.learned_limit else "")
            + (
                f"  limit estimate {k.limit_estimate} ({k.estimate_reason})"
                if not k.learned_limit
                and k.limit_estimate
                and k.estimate_reason not in ("", "told", "advertised")
                else ""
            )
            + (f"  {'' if out else 'refused: '}{refusal(k)}" if k.state == "blocked" else "")
            + (f"  shared: someone else used {k.shared_share:.0%} of a window" if k.shared_share else "")
        )
    lines += token_key_lines(snap)
    if snap.spend is not None:
        lines += spend_lines(snap.spend)[1:]  # the run's line is the metrics block's
    return lines


#: A job the limits allow in less than this went out of the keys' first buckets: its makespan
#: is round trips and ramp-up, not pacing, and no ratio is shown.
FIRST_BUCKETS_S = 1.0


def makespan_line(m: Makespan) -> str:
    """A job run's makespan: "makespan     600 jobs in 61.2 s, least 59.1 s the limits allow: ratio 1.036"."""
    if m.ratio is None:
        return f"makespan     {m.jobs} jobs done"
    if m.least_s < FIRST_BUCKETS_S:  # a ratio to nearly nothing says nothing
        return (
            f"makespan     {m.jobs} jobs in {m.elapsed_s:.1f} s; the limits allowed them at once"
            " (the keys' first buckets held them all)"
        )
    return (
        f"makespan     {m.jobs} jobs in {m.elapsed_s:.1f} s, least {m.least_s:.1f} s the limits allow:"
        f" ratio {m.ratio:.3f}"
    )


def refused_keys(snap: Snapshot) -> list[KeyRow]:
    """The keys the server refused for good (blocked), in key order."""
    return [k for k in snap.keys if k.state == "blocked"]


def key_name(k: KeyRow) -> str:
    """A key as it may be printed: label, masked secret, fingerprint."""
    return f"{k.label} {k.masked}" + (f" {k.fingerprint}" if k.fingerprint else "")


def out_of_quota(k: KeyRow) -> bool:
    """A key refused for good by a 429 (or a message about its quota): it has run out of what it
    may spend (OpenAI's insufficient_quota), not of its rate: waiting does not bring it back."""
    return k.state == "blocked" and (k.refused_status == 429 or "quota" in k.refused_message.lower())


def refusal(k: KeyRow) -> str:
    """What refused a key: "HTTP 401: bad key", or for a key out of quota "out of quota
    (HTTP 429: You exceeded your current quota...)" (the message is masked where it was made)."""
    said = f"HTTP {k.refused_status}" if k.refused_status is not None else "refused"
    message = k.refused_message
    said = f"{said}: {message}" if message and message != said else said
    return f"out of quota ({said})" if out_of_quota(k) else said


def nothing_worked(snap: Snapshot, facts: RunFacts) -> str | None:
    """One line when the run achieved nothing (exit 1), else None: the server refused every key,
    the target never answered, or no request succeeded and some failed."""
    if _every_key_refused(snap):
        by: dict[str, list[str]] = {}
        for k in refused_keys(snap):
            by.setdefault(refusal(k), []).append(k.label)
        said = "; ".join(f"{what} ({', '.join(labels)})" for what, labels in by.items())
        return f"every key was refused by the server: {said}; stopped, nothing more can be sent"
    if facts.answers == 0 and facts.no_answer:  # attempts ended, none with an answer
        return f"the target never answered: {snap.sent} attempts ({_counts(facts.no_answer)})"
    tried = snap.rejected_429 + snap.rejected_other + snap.failed
    if snap.succeeded == 0 and tried:
        answers = f" ({_counts((f'HTTP {s}', n) for s, n in facts.statuses)})" if facts.statuses else ""
        return f"nothing succeeded: {tried} of {snap.sent} attempts failed{answers}"
    return None


def cluster_summary_line(view: ClusterView) -> str:
    """The cluster last read (a shared store), in one line: members, what they sent, the shared queues."""
    away = sum(1 for m in view.members if m.store != "ok")
    members = f"{len(view.members)} member{'' if len(view.members) == 1 else 's'}"
    if away:
        members += f" ({away} cut off from the store)"
    sent = sum(m.sent for m in view.members)
    ok = sum(m.succeeded for m in view.members)
    return (
        f"cluster      {members}: {sent} sent, {ok} ok together; shared queues {view.waiting} waiting,"
        f" {view.claimed} claimed, {view.uncertain} uncertain, {view.graveyard} graveyard"
        f" (read at {view.read_at_s:.1f}s)"
    )


def store_lines(store: StoreReport) -> list[str]:
    """Where every job of the store is (`--store`), and what this run took back and journaled."""
    c = store.counts
    done = "".join(f" + {c.done.get(e, 0)} {e}" for e in ("succeeded", "expired", "graveyard", "shed"))
    lines = [
        f"store        {store.url}: {c.total} jobs = {c.pending} pending + {c.claimed} in flight"
        f" + {c.uncertain + c.done.get('uncertain', 0)} uncertain{done}",
        f"             journaled {store.journaled} endings of this run",
    ]
    if store.recovered:
        what = "sent again" if store.retried_uncertain else "now uncertain"
        lines[-1] += f"; resumed {store.recovered} jobs a stopped run held ({what})"
    if store.persistence == "none":
        lines.append(
            "             kept across a restart: nothing (appendonly no, save ''): a restart loses the work"
        )
    if store.left_claimed and store.at_work:
        lines.append(
            f"             {store.left_claimed} jobs were held by a run still at work"
            f" ({', '.join(store.at_work)}) and were left to it: sent by both, they would go twice"
        )
    elif store.left_claimed:
        lines.append(
            f"             {store.left_claimed} jobs were held by a run that did not end (killed?) and were"
            " left to it: --resume takes them back"
        )
    if store.lost_claims:
        lines.append(
            f"             lost {store.lost_claims} claimed jobs: the store lost its state while this run held them"
        )
    return lines


# ---------------------------------------------------------------- output paths


def check_output_path(path: str | os.PathLike, what: str) -> str | None:
    """None when `path` can be written (created or appended to); else one line saying why.

    Checked before a run, so a typo costs a second, not a run's results.
    """
    p = Path(path)
    if p.is_dir():
        return f"{what} {path}: is a directory"
    if p.exists():
        return None if os.access(p, os.W_OK) else f"{what} {path}: not writable"
    parent = p.parent
    if not parent.is_dir():
        return f"{what} {path}: no such directory {parent}"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"{what} {path}: cannot create files in {parent}"
    return None


def check_outputs(cfg: RunConfig) -> list[str]:
    """Every output path of the run that cannot be written, one line each."""
    report = cfg.runner.report if cfg.runner.report != "-" else None  # "-": stdout
    wanted = [
        (report, "report"),
        (cfg.engine_settings.engine.graveyard_path, "graveyard"),
        (cfg.engine_settings.engine.record_path, "recording"),
        (cfg.runner.results, "results"),
        (cfg.runner.errors, "errors"),
    ]
    messages = cfg.engine_settings.messages
    if messages is not None and messages.shed_path:
        wanted.append((messages.shed_path, "shed file"))
    problems: list[str] = []
    bad_dirs: set[Path] = set()  # one line per place (a graveyard next to an unwritable report)
    for path, what in wanted:
        if not path or path == GRAVEYARD_AUTO or Path(path).parent in bad_dirs:  # auto: placed later
            continue
        if problem := check_output_path(path, what):
            problems.append(problem)
            bad_dirs.add(Path(path).parent)
    return problems


# ---------------------------------------------------------------- signals


class StopSignals:
    """SIGINT/SIGTERM/SIGHUP on the loop: the first asks for a drain, a second for a stop at once."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self.drain = asyncio.Event()
        self.now = asyncio.Event()
        self.any = asyncio.Event()  # set by every signal; cleared by whoever waits for the next one
        self.count = 0
        self._installed: list[int] = []

    def install(self) -> StopSignals:
        for sig in STOP_SIGNALS:
            try:
                self.loop.add_signal_handler(sig, self._on_signal)
            except (NotImplementedError, RuntimeError, ValueError):  # not the main thread, or Windows
                continue
            self._installed.append(sig)
        return self

    def _on_signal(self) -> None:
        self.count += 1
        (self.drain if self.count == 1 else self.now).set()
        self.any.set()

    def remove(self) -> None:
        for sig in self._installed:
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                self.loop.remove_signal_handler(sig)
        self._installed.clear()


# ---------------------------------------------------------------- the run


def _say(text: str, file: TextIO) -> None:
    """Print, even to a terminal that hung up (SIGHUP): the report still gets written."""
    try:
        print(text, file=file, flush=True)
    except (OSError, ValueError):
        pass


def target_silent(facts: RunFacts, elapsed_s: float) -> bool:
    """True when the target has not answered once, for long enough and often enough."""
    return (
        facts.answers == 0
        and elapsed_s >= DEAD_TARGET_S
        and facts.consecutive_no_answer >= DEAD_TARGET_ATTEMPTS
    )


async def stop_session(session: Session, signals: StopSignals | None, out: TextIO) -> tuple[Snapshot, bool]:
    """Drain the session; a second signal cuts the drain short. Returns (snapshot, stopped at once)."""
    drain = asyncio.ensure_future(session.stop())
    waiters: set[asyncio.Future] = {drain}
    cut = asyncio.ensure_future(signals.now.wait()) if signals is not None else None
    if cut is not None:
        waiters.add(cut)
    try:
        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if cut is not None:
            cut.cancel()
    if drain.done():
        try:
            return drain.result(), False
        except Exception as exc:  # a bug while draining: still report what there is
            _say(f"ratedeck: draining failed ({type(exc).__name__}); stopping at once", sys.stderr)
            return await _stop_now(session), True
    _say("ratedeck: stopping at once: what is left is reported as queued or in flight", out)
    drain.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await drain
    return await _stop_now(session), True


async def _stop_now(session: Session) -> Snapshot:
    try:
        return await session.stop(drain_timeout_s=0)
    except Exception:
        return session.snapshot()


def conclude(
    snap: Snapshot,
    facts: RunFacts,
    cfg: RunConfig,
    *,
    out: TextIO,
    server_stats: dict | None = None,
    stopped_at_once: bool = False,
    thresholds: list[Threshold] | tuple[Threshold, ...] = (),
) -> int:
    """Print the summary and the verdict, write the report; the exit code (see the module doc).

    `thresholds` (`--fail-on`) are checked against the report; each one's
    result is printed and kept in the report's `thresholds`.
    """
    err = sys.stderr
    if snap.no_limit:  # no limit given, none advertised: a usage error, said in one line
        _say(f"ratedeck: {cfg.engine_settings.target.url or 'the target'}: {snap.no_limit}", err)
        return ExitCode.USAGE
    _say("\n".join(summary_lines(snap, facts)), out)
    if server_stats:
        _say(simulator_line(server_stats), out)
    codes = _output_codes(snap, facts, out, err)
    if snap.balance() != 0:
        accounted = snap.generated - snap.balance()
        _say(
            f"ratedeck: the accounting does not balance: {snap.generated} generated, {accounted} accounted"
            f" for ({snap.balance():+d}); a request was lost or counted twice",
            err,
        )
        codes.append(ExitCode.UNBALANCED)
    if facts.store is not None:
        codes += _store_codes(facts.store, snap, err)
    if snap.uncertain:
        _say(
            f"ratedeck: {snap.uncertain} requests are uncertain: a write that may have happened"
            " (--results lists them with the server's request id); not sent on another key",
            err,
        )
    capped = cap_line(cfg, snap, facts.store)
    if capped is not None:
        _say(capped, err)
        codes.append(ExitCode.COST_CAP)
    nothing = nothing_worked(snap, facts)
    if nothing is not None:
        _say(Redactor(k.secret for k in cfg.engine_settings.keys)(f"ratedeck: {nothing}"), err)
        codes.append(ExitCode.FAILED)
    report = build_report(snap, server_stats, facts.store)
    if thresholds and _thresholds_failed(thresholds, report, out, err):
        codes.append(ExitCode.THRESHOLD)
    if cfg.runner.report is not None:
        report_problem = write_report(snap, cfg.runner.report, server_stats, report=report)
        if report_problem:
            _say(f"ratedeck: {report_problem}", err)
            codes.append(ExitCode.OUTPUT)
        elif cfg.runner.report != "-":
            _say(f"report written to {cfg.runner.report}", out)
    if stopped_at_once:
        codes.append(ExitCode.INTERRUPTED)
    return first_of(codes)


def simulator_line(server_stats: dict) -> str:
    """The embedded simulator's own count of the run, and whether its window audit held."""
    t = server_stats["totals"]
    return (
        f"simulator    accepted {t['accepted']}  429 {t['rejected_429']}  nonce rejected {t['rejected_nonce']}"
        f"  during cooldown {t['requests_during_cooldown']}  escalations {t['escalations']}"
        f"  audit {'ok' if server_stats['audit_ok'] else 'EXCEEDED'}"
    )


def _output_codes(snap: Snapshot, facts: RunFacts, out: TextIO, err: TextIO) -> list[ExitCode]:
    """Say where the graveyard and results lines went, or how much of them did not; OUTPUT per
    file left incomplete. The run's other problems are said here too."""
    codes: list[ExitCode] = []
    if facts.graveyard_problem:
        _say(
            f"ratedeck: graveyard incomplete: {facts.graveyard_written} of {snap.graveyard} buried requests"
            f" written ({facts.graveyard_problem})",
            err,
        )
        codes.append(ExitCode.OUTPUT)
    elif facts.graveyard_path and facts.graveyard_written:
        _say(f"graveyard: {facts.graveyard_written} requests in {facts.graveyard_path}", out)
    if facts.results_problem:
        _say(
            f"ratedeck: results incomplete: {facts.results_written} lines written ({facts.results_problem})",
            err,
        )
        codes.append(ExitCode.OUTPUT)
    elif facts.results_path:
        _say(f"results: {facts.results_written} requests in {facts.results_path}", out)
    for problem in facts.problems:
        if problem not in (facts.graveyard_problem, facts.results_problem):
            _say(f"ratedeck: {problem}", err)
    return codes


def _store_codes(store: StoreReport, snap: Snapshot, err: TextIO) -> list[ExitCode]:
    """A store run's journal checked against the run's own count: OUTPUT when endings went
    unwritten, UNBALANCED when the two counts differ. Uncertain jobs are said, not failed."""
    codes: list[ExitCode] = []
    if store.problem or store.unjournaled:
        _say(
            f"ratedeck: store incomplete: {store.journaled} endings journaled, {store.unjournaled} not"
            f" ({store.problem or 'not written'})",
            err,
        )
        codes.append(ExitCode.OUTPUT)
    elif store.journaled != ended(snap):
        _say(f"ratedeck: the store journaled {store.journaled} endings, the run counted {ended(snap)}", err)
        codes.append(ExitCode.UNBALANCED)
    if store.counts.uncertain:
        _say(
            f"ratedeck: {store.counts.uncertain} jobs are uncertain: a killed run may have sent them"
            " (or their write may have happened), and they are not sent again",
            err,
        )
    return codes


def _thresholds_failed(
    thresholds: list[Threshold] | tuple[Threshold, ...], report: dict, out: TextIO, err: TextIO
) -> bool:
    """Check `thresholds` over `report`, print each verdict and keep them in the report's
    `thresholds`; whether any failed."""
    verdicts = evaluate(list(thresholds), report)
    report["thresholds"] = [
        {
            "expression": v.threshold.expression,
            "field": v.threshold.field,
            "value": v.actual,
            "failed": v.failed,
        }
        for v in verdicts
    ]
    for v in verdicts:
        _say(f"threshold    {'FAILED' if v.failed else 'ok    '} {v.line()}", out)
    failed = [v for v in verdicts if v.failed]
    for v in failed:
        _say(f"ratedeck: threshold failed: {v.line()}", err)
    return bool(failed)


@dataclass(frozen=True)
class MetricsEndpoint:
    """`--metrics-port`, `--metrics-host`, `--metrics-linger`: where /metrics is served, and how
    long the final numbers stay up after the run (so a scraper gets the end of the run)."""

    port: int
    host: str = "127.0.0.1"
    linger_s: float = 0.0


async def run_headless(
    cfg: RunConfig,
    interval_s: float = 5.0,
    out: TextIO | None = None,
    *,
    thresholds: list[Threshold] | tuple[Threshold, ...] = (),
    metrics: MetricsEndpoint | None = None,
    procs: int = 1,
) -> int:
    """Run until the duration passes, the workload ends, a signal, or a target that never answers.

    With `procs` above 1 the keys are shared out among that many engine processes
    (host/shards.py) and the summary and report are of the merged run."""
    out = out or sys.stdout
    cfg = with_graveyard_place(cfg)  # none named: next to the report, else the XDG state dir
    problems = check_outputs(cfg)
    if problems:
        for problem in problems:
            _say(f"ratedeck: {problem}", sys.stderr)
        return ExitCode.USAGE
    loop = asyncio.get_running_loop()
    if procs > 1:
        signals = StopSignals(loop).install()
        try:
            return await _run_sharded(cfg, procs, interval_s, out, signals, thresholds)
        finally:
            signals.remove()
    exporter: MetricsServer | None = None
    source: LoopSource | None = None
    if metrics is not None:
        from .prometheus import LoopSource, MetricsPortError, serve_metrics

        source = LoopSource(loop, cfg.engine_settings.capacity_tps)
        try:
            exporter = serve_metrics(source, metrics.port, metrics.host)
        except MetricsPortError as exc:
            _say(f"ratedeck: {exc}", sys.stderr)
            return ExitCode.USAGE
    signals = StopSignals(loop).install()  # before the start: Ctrl-C while starting drains too
    try:
        return await _run(cfg, interval_s, out, signals, thresholds, source, exporter, metrics)
    finally:
        signals.remove()
        if exporter is not None:
            exporter.close()


def _workload_done(cfg: RunConfig, snap: Snapshot) -> bool:
    """A sharded run with `workload.total`: every request generated and none left anywhere."""
    total = cfg.engine_settings.workload.total
    if snap.no_limit:
        return True  # no limit given and none advertised: the run stops
    return (
        total is not None
        and snap.generated >= total
        and not (snap.main_depth or snap.dlq_depth or snap.in_flight)
    )


def _every_key_refused(snap: Snapshot) -> bool:
    """Every key of the run was refused for good: nothing more can be sent (exit 1)."""
    return bool(snap.keys) and len(refused_keys(snap)) == len(snap.keys)


async def _watch(
    cfg: RunConfig,
    interval_s: float,
    out: TextIO,
    signals: StopSignals,
    waiters: list[asyncio.Future],
    facts: Callable[[], RunFacts],
    snapshot: Callable[[], Snapshot],
    done: Callable[[], bool],
    events: Callable[[], Iterable[Event]] | None = None,
) -> None:
    """A headless run while it runs: metrics every `interval_s` until the duration ends,
    Ctrl-C asks for a drain, `done()` (the work is over) or the target stays silent.

    Wakes for the next print, the deadline, a tick, a drain or any of `waiters`
    (which it cancels at the end, with its own). `events` reads the event log: an endpoint
    leaving or coming back to the pool is printed as it happens."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    deadline = started + cfg.runner.duration_s if cfg.runner.duration_s else None
    next_print = started + interval_s
    waiters = [asyncio.ensure_future(signals.drain.wait()), *waiters]
    tail = EndpointEvents()
    try:
        while not signals.drain.is_set() and not done():
            now = loop.time()
            if deadline is not None and now >= deadline:
                break
            wake = min(next_print, deadline if deadline is not None else next_print, now + _TICK_S)
            await asyncio.wait(waiters, timeout=max(0.0, wake - now), return_when=asyncio.FIRST_COMPLETED)
            now = loop.time()
            if events is not None:
                for e in tail.new(events()):
                    _say(f"ratedeck: {e.at_s:.1f} s: {e.text}", out)
            seen = facts()
            if target_silent(seen, now - started):
                _say(
                    f"ratedeck: no answer from the target in {now - started:.0f} s"
                    f" ({_counts(seen.no_answer)}); stopping",
                    out,
                )
                break
            if now >= next_print and not signals.drain.is_set() and not done():
                _say("\n".join(metrics_block(snapshot())), out)
                while next_print <= now:
                    next_print += interval_s
        if signals.drain.is_set():
            _say("ratedeck: stopping: no new requests, letting in-flight ones finish…", out)
    finally:
        for w in waiters:
            w.cancel()


async def _run_sharded(
    cfg: RunConfig,
    procs: int,
    interval_s: float,
    out: TextIO,
    signals: StopSignals,
    thresholds: list[Threshold] | tuple[Threshold, ...] = (),
) -> int:
    """`--procs N` headless: the same run loop over a `ShardedHost`, one merged summary."""
    from ratedeck.host.shards import ShardedHost, ShardError

    loop = asyncio.get_running_loop()
    host = ShardedHost(cfg, procs)
    try:
        await loop.run_in_executor(None, host.start)
    except (ConfigError, ShardError) as exc:
        await loop.run_in_executor(None, host.abort)
        _say(f"ratedeck: {exc}", sys.stderr)
        return ExitCode.USAGE
    except (OSError, RuntimeError, TimeoutError) as exc:
        await loop.run_in_executor(None, host.abort)
        _say(f"ratedeck: cannot start: {exc}", sys.stderr)
        return ExitCode.USAGE
    where = "embedded simulator" if cfg.engine_settings.target.url is None else "target"
    _say(
        f"ratedeck: {_keys(len(cfg.engine_settings.keys))} in {host.procs} processes, {_capacity(cfg.engine_settings.capacity_tps)},"
        f" {where}" + (f", {cfg.runner.duration_s:g} s" if cfg.runner.duration_s else ", Ctrl-C to stop"),
        out,
    )
    await _watch(
        cfg,
        interval_s,
        out,
        signals,
        waiters=[],
        facts=lambda: host.facts,
        snapshot=host.snapshot,
        done=lambda: _workload_done(cfg, snap := host.snapshot()) or _every_key_refused(snap),
        events=(lambda: host.snapshot().events) if cfg.engine_settings.endpoints else None,
    )
    stopping = loop.run_in_executor(None, host.stop_blocking)
    cut = asyncio.ensure_future(signals.now.wait())
    either: list[asyncio.Future[Any]] = [stopping, cut]
    await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
    if not stopping.done():
        _say("ratedeck: stopping at once: what is left is reported as queued or in flight", out)
        await loop.run_in_executor(None, host.abort)
    cut.cancel()
    snap = await stopping
    code = conclude(
        snap,
        host.facts,
        cfg,
        out=out,
        server_stats=host.server_stats,
        stopped_at_once=host.aborted or signals.now.is_set(),
        thresholds=thresholds,
    )
    if cfg.runner.plot:
        from .plots import run_charts

        _say(run_charts(snap, color=out.isatty()), out)
    return code


async def _run(
    cfg: RunConfig,
    interval_s: float,
    out: TextIO,
    signals: StopSignals,
    thresholds: list[Threshold] | tuple[Threshold, ...] = (),
    source: LoopSource | None = None,
    exporter: MetricsServer | None = None,
    metrics: MetricsEndpoint | None = None,
) -> int:
    session = Session(cfg)
    try:
        engine = await session.start()
    except ConfigError as exc:
        _say(f"ratedeck: {exc}", sys.stderr)
        return ExitCode.USAGE
    except OSError as exc:
        _say(f"ratedeck: cannot start: {exc.strerror or exc}", sys.stderr)
        return ExitCode.USAGE
    if source is not None:
        source.engine = engine
    finished = engine.finished
    assert finished is not None  # made by session.start()
    _say(
        f"ratedeck: {_keys(len(cfg.engine_settings.keys))}, {_capacity(cfg.engine_settings.capacity_tps)}, {session.where} {session.shown_target}"
        + (f", {cfg.runner.duration_s:g} s" if cfg.runner.duration_s else ", Ctrl-C to stop"),
        out,
    )
    if exporter is not None:
        _say(f"ratedeck: metrics at {exporter.url}", out)
    await _watch(
        cfg,
        interval_s,
        out,
        signals,
        waiters=[asyncio.ensure_future(finished.wait())],
        facts=lambda: session.facts,
        snapshot=engine.snapshot,
        done=finished.is_set,
        events=(lambda: engine.parts.log.rows) if cfg.engine_settings.endpoints else None,
    )
    snap, at_once = await stop_session(session, signals, out)
    if source is not None:
        from .prometheus import engine_scrape

        source.finish(engine_scrape(engine))
    code = conclude(
        snap,
        session.facts,
        cfg,
        out=out,
        server_stats=session.server_stats,
        stopped_at_once=at_once,
        thresholds=thresholds,
    )
    if cfg.runner.plot:
        from .plots import run_charts

        _say(run_charts(snap, color=out.isatty()), out)
    if exporter is not None and metrics is not None and metrics.linger_s > 0 and not at_once:
        _say(
            f"ratedeck: serving the final metrics at {exporter.url} for {metrics.linger_s:g} s"
            " (Ctrl-C to end now)",
            out,
        )
        signals.any.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(signals.any.wait(), metrics.linger_s)
    return code
