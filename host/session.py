"""Running an engine: the target (maybe the embedded simulator), the transport, the host.

Where the engine's loop runs:
- `Session` runs everything on the caller's loop (headless runner, library, tests);
- the console runs a `Session` in a child process (`process_host.ProcessHost`),
  so rendering does not share the engine's interpreter lock
  (docs/benchmarks.md, "console open vs headless").
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ratedeck.config import ConfigError, RunConfig, to_toml_dict
from ratedeck.core.loops import tune_gc
from ratedeck.core.secrets import safe_url
from ratedeck.core.study_server import STUDY, current_name
from ratedeck.core.vocab import Ending, EventKind, HeadroomMode, Phase
from ratedeck.engine.commands import Command
from ratedeck.engine.engine import Engine
from ratedeck.engine.http.outcome import Outcome
from ratedeck.engine.http.transport import Response, Transport, http_transport
from ratedeck.engine.jsonl import JsonLines
from ratedeck.engine.llm.batch import BatchFormat, batch_format, failed, output_record
from ratedeck.engine.ports import ResultsHost, SharedState, Source
from ratedeck.engine.queues import Graveyard
from ratedeck.engine.request import Request, line_fields
from ratedeck.engine.snapshot import Snapshot
from ratedeck.engine.sources.workload import Workload
from ratedeck.store.base import StoreReport
from ratedeck.store.work import StoreRun, open_for_run

from .protocol import RunFacts

if TYPE_CHECKING:
    from ratedeck.server.app import RunningServer

__all__ = ["ResultsFile", "RunFacts", "Session", "current_config", "embedded_server_settings"]

#: A response body in a results line is cut to this many characters (after masking keys).
RESULTS_BODY_CHARS = 64 * 1024


def embedded_server_settings(cfg: RunConfig):
    """Simulator settings for a run with no target: the config's [server] table,
    with the run's keys unless the table names its own.

    In study mode the simulator is the study's server, 20/1s per key,
    whatever the run is told (`--limit 30/1s` then meets real 429s, which is
    how a threshold like `--fail-on rejected_429>0` is tried); in standard
    mode it enforces the run's own limits unless the table names its own.
    """
    from ratedeck.server.settings import ServerSettings

    table = dict(cfg.server) or {"mode": STUDY}
    if "mode" in table:
        table["mode"] = current_name("mode", table["mode"])
    if "keys" not in table:
        table["keys"] = [k.secret for k in cfg.engine_settings.keys]
    if "policies" not in table and cfg.engine_settings.keys and table.get("mode", STUDY) != STUDY:
        table["policies"] = [str(p) for p in cfg.engine_settings.keys[0].policies]
    try:
        return ServerSettings.from_dict(table)
    except ValueError as exc:
        raise ConfigError("config", "server", str(exc)) from None


class Session:
    """One run on the current loop: opens the target, builds and starts the engine.

    An `EngineHost` (host/protocol.py): `stop_blocking` and `abort` are for another
    thread than the loop's (on the loop itself, `await stop()`).
    """

    def __init__(self, cfg: RunConfig, transport: Transport | None = None, source: Source | None = None):
        self.cfg = cfg
        self._transport = transport
        # Where the work comes from when not the config's workload (live clients: the gateway).
        self._source = source
        self.server: RunningServer | None = None  # the embedded simulator, when there is no target
        self.server_stats: dict | None = None  # its own count, kept at stop
        self.engine: Engine | None = None
        self.target_url: str | None = cfg.engine_settings.target.url
        self.results: ResultsFile | None = None  # --results: one line per finished request
        self.store_run: StoreRun | None = None  # --store: the engine's work comes from a store
        self.store_report: StoreReport | None = None  # kept at stop
        self.aborted = False  # stopped at once (`abort`), not drained
        self._closed = False

    @property
    def shown_target(self) -> str:
        """The target as it may be printed: no credentials, no query string."""
        return safe_url(self.target_url) or "?"

    async def start(self) -> Engine:
        cfg = self.cfg
        tune_gc()  # an engine process: collect less often (core/loops.py)
        try:
            if self._transport is None:
                url = cfg.engine_settings.target.url
                if url is None:
                    from ratedeck.server.app import start_server

                    self.server = await start_server(embedded_server_settings(cfg))
                    url = f"{self.server.url}/api/request"
                self.target_url = url
                self._transport = http_transport(cfg.engine_settings, url)
            source, shared = await self._work()
            self.engine = Engine(cfg.engine_settings, self._transport, source=source, shared_state=shared)
            if self.store_run is not None:
                self.store_run.attach(self.engine)
            if cfg.runner.results or cfg.runner.errors:
                self.results = ResultsFile(
                    cfg.runner.results,
                    self.engine,
                    body=cfg.runner.results_body,
                    link=cfg.runner.results_id,
                    errors=cfg.runner.errors,
                    store=self.store_run is not None,
                    append=self.store_run is not None,
                    resume=cfg.runner.resume,
                    request_id_headers=cfg.engine_settings.target.request_id_headers,
                )
                self.engine.watch(self.results)
            self.engine.start()
        except BaseException:
            await self._close()  # nothing left open behind a failed (or interrupted) start
            raise
        where = "embedded simulator" if self.server else "target"
        self.engine.event(EventKind.INFO, f"{where}: {self.shown_target}")
        return self.engine

    async def _work(self) -> tuple[Source | None, SharedState | None]:
        """Where the engine's work comes from (the given source, a store's jobs, else the
        config's workload) and the state it shares with other processes (a store many share)."""
        cfg = self.cfg
        store = open_for_run(cfg.runner, cfg.engine_settings)
        if store is None:
            return self._source, None
        if self._source is not None:
            # The work comes from the given source; a store many processes share still shares
            # the budgets. One that only holds jobs has nothing to give such a run.
            shared = store.shared()
            await store.close()
            if shared is None:
                raise ConfigError(
                    "command line",
                    "--store",
                    "this run's work comes from its clients: only a store many processes share"
                    " (redis://host:port/db) has anything for it (the keys' budgets)",
                )
            return self._source, shared
        self.store_run = StoreRun(
            cfg.runner, cfg.engine_settings, store, random.Random(cfg.engine_settings.seed)
        )
        await self.store_run.prepare()
        # A store many processes share (Redis) also shares the keys' budgets and gates.
        return self.store_run.source, store.shared()

    @property
    def facts(self) -> RunFacts:
        """Counts from the transport and the graveyard, for the summary and the exit code."""
        t = self._transport.stats() if self._transport is not None else {}
        engine = self.engine
        graveyard = engine.graveyard if engine is not None else None
        return RunFacts(
            answers=t.get("answers"),
            statuses=tuple(t.get("statuses", {}).items()),
            no_answer=tuple(t.get("no_answer", {}).items()),
            redirects=tuple(t.get("redirects", {}).items()),
            consecutive_no_answer=t.get("consecutive_no_answer", 0),
            retried=t.get("retried", 0),
            graveyard_path=graveyard.path if graveyard is not None else None,
            graveyard_written=graveyard.written if graveyard is not None else 0,
            graveyard_problem=graveyard.problem if graveyard is not None else None,
            problems=tuple(engine.problems) if engine is not None else (),
            results_path=self.results.shown_path if self.results is not None else None,
            results_written=self.results.written if self.results is not None else 0,
            results_problem=self.results.problem if self.results is not None else None,
            store=self.store_report,
        )

    def snapshot(self) -> Snapshot:
        if self.engine is None:
            return Snapshot(phase=Phase.STARTING, capacity_tps=self.cfg.engine_settings.capacity_tps)
        return self.engine.snapshot()

    def _started(self) -> Engine:
        if self.engine is None:
            raise RuntimeError("the session has not started")
        return self.engine

    def send(self, command: Command) -> None:
        engine = self._started()
        try:
            engine.apply(command)
        except (ValueError, TypeError) as exc:
            engine.event(EventKind.ERROR, str(exc))

    def effective_config(self) -> dict:
        return to_toml_dict(current_config(self.cfg, self._started()))

    async def stop(self, drain_timeout_s: float | None = None) -> Snapshot:
        """Drain (bounded by `drain_timeout_s`, default the config's) and close everything.

        Cancelled during the drain, it closes nothing: call it again with
        `drain_timeout_s=0` to stop at once; what is still queued or in flight
        is then reported as such.
        """
        snap = await self._started().stop(drain_timeout_s)
        await self._close()
        return snap

    def stop_blocking(self, timeout_s: float = 30.0) -> Snapshot:
        """From another thread: drain on the engine's loop and wait (at most `timeout_s`, then `abort`)."""
        loop = self._other_loop()
        if loop is None:
            return self.snapshot()
        done = asyncio.run_coroutine_threadsafe(self.stop(), loop)
        try:
            return done.result(timeout_s)
        except concurrent.futures.TimeoutError:
            done.cancel()
            return self.abort()

    def abort(self) -> Snapshot:
        """From another thread: stop at once; what is left is reported as queued or in flight."""
        self.aborted = True
        loop = self._other_loop()
        if loop is None:
            return self.snapshot()
        return asyncio.run_coroutine_threadsafe(self.stop(drain_timeout_s=0), loop).result()

    def _other_loop(self) -> asyncio.AbstractEventLoop | None:
        """The engine's loop (None: not started), refused when called on that loop itself."""
        loop = self.engine.loop if self.engine is not None else None
        if loop is None or loop.is_closed():
            return None
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            raise RuntimeError("on the engine's own loop: await stop() instead")
        return loop

    async def _close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self.store_run is not None:
            self.store_report = await self.store_run.finish(self.engine)
        if self.engine is not None:
            self.engine.graveyard.close()
            if self.results is not None:
                if self.engine.ended_at is not None:
                    self.results.left_over()
                    source = self.engine.source
                    if self.store_run is None and isinstance(source, Workload) and source.items is not None:
                        self.results.not_read(source.items)
                self.results.close()
        if self._transport is not None:
            await self._transport.close()
        if self.server is not None:
            self.server_stats = self.server.rules.stats()
            await self.server.close()


def current_config(cfg: RunConfig, engine: Engine) -> RunConfig:
    """The run's config with the live settings (headroom, backpressure, rate) folded in."""
    h = engine.headroom
    eng = dataclasses.replace(
        cfg.engine_settings.engine,
        backpressure=engine.backpressure,
        headroom=HeadroomMode.ADAPTIVE if h.adaptive else round(h.value_ms, 1),
    )
    fed = engine.source.fed  # a job with no arrival rate stays one when saved
    wl = dataclasses.replace(cfg.engine_settings.workload, rate=None if fed else engine.source.rate)
    return cfg.replace(engine=eng, workload=wl)


# ---------------------------------------------------------------- results file


class ResultsFile:
    """`--results FILE.jsonl`: one JSON line per request, written and flushed as it ends.

    Every request that ends (succeeded, uncertain, expired, graveyard, shed) is written
    by the engine's finish watcher; at the end of the run the requests still
    queued or in flight are written too (ending "queued", "in_flight"), so
    the file holds every generated request exactly once. A kill -9 leaves at
    most a partial last line (readers skip it). Lines never carry a key: the
    key is named by its label, and texts and parameters are masked.

    A line: id, key, ending, status, attempts, error, created_at,
    intended_at, first_sent_at, done_at (Unix seconds), latency_ms (the last
    attempt's send -> answer), total_ms (intended arrival -> done),
    queue_wait_ms (arrival -> first send), line_id (the workload line's
    `link` field, `_id` unless `--results-id` names another: what ties the
    line to its answer; null when it has none), params (the line's own
    fields), pool and line (its underscore fields `LINE_FIELDS`, as written,
    when it had any): together the line again, which `ratedeck replay` sends;
    request_id (the server's id of the attempt that left it uncertain, when it
    gave one), and with `--results-body` the answer's body: parsed when the
    answer is JSON (its Content-Type says so and it parses whole), else text.

    A line of a provider's batch file (`engine/llm/batch.py`) is written in
    that API's output format instead, always with the answer's body and request id.
    In a store run (`store`) a batch line left queued or in flight is not written: it
    goes back to the store, and the run that ends it writes it. A store run `append`s to
    the files the store's earlier runs wrote (a kill -9's partial last line cut off), and
    a `resume` writes no `custom_id` they already hold (a job a killed run answered but had
    not yet journaled is sent again; its second answer is not written).
    `errors` (`--errors FILE`) takes the lines that did not succeed, as a Batch API's
    error file does; `path` may then be None (only the errors are kept).
    """

    def __init__(
        self,
        path: str | None,
        engine: ResultsHost,
        body: bool = False,
        link: str = "_id",
        *,
        errors: str | None = None,
        store: bool = False,
        append: bool = False,
        resume: bool = False,
        request_id_headers: tuple[str, ...] = (),
    ):
        self.path = path
        self.engine = engine
        self.body = body
        self.link = link
        self.store = store
        self.redact = engine.redact
        # Where a batch line's request id is read: the target's own headers, then the usual ones.
        self.request_id_headers = tuple(dict.fromkeys((*request_id_headers, *REQUEST_ID_HEADERS)))
        # custom_ids already written (a resumed run's files hold the killed run's)
        self.done: set[Any] = set()
        self.out = self._open(path, "results", append, resume) if path else None
        self.errors = self._open(errors, "errors", append, resume) if errors else None

    def _open(self, path: str, what: str, append: bool, resume: bool) -> JsonLines:
        """A new file for this run (a graveyard appends), or with `append` the one the store's
        earlier runs wrote; a `resume` writes none of the custom_ids it holds."""
        if append:
            cut_partial_line(path)
            if resume:
                self.done |= written_custom_ids(path)
        return JsonLines(path, what, fresh=not append)

    @property
    def shown_path(self) -> str | None:
        """Where the lines go, as the summary says it."""
        if self.errors is None:
            return self.path
        if self.out is None:
            return f"{self.errors.path} (errors only)"
        return f"{self.path} (errors in {self.errors.path})"

    @property
    def written(self) -> int:
        return sum(f.written for f in (self.out, self.errors) if f is not None)

    @property
    def problem(self) -> str | None:
        return next((f.problem for f in (self.out, self.errors) if f is not None and f.problem), None)

    def finished(self, req: Request, ending: Ending) -> None:
        self._write(req, str(ending), self.engine.clock())

    def left_over(self) -> None:
        """After the engine stopped: what is still queued or in flight, one line each."""
        now = self.engine.clock()
        for req in self.engine.queued():
            self._write(req, "queued", now)
        for req in self.engine.in_flight_requests():
            if req.ending is None:
                self._write(req, "in_flight", now)

    def not_read(self, items: Iterator[dict]) -> None:
        """After a file run stopped (a cap, a stop): the batch lines it never read, as never sent,
        so a batch file's every line has its output line. A ratedeck file's are left unread."""
        try:
            for item in items:
                fmt = batch_format(item)
                if fmt is None:
                    return
                custom_id = item.get("_id")
                if custom_id not in self.done:
                    self.done.add(custom_id)
                    self._put(output_record(fmt, custom_id, "queued", None, None, None, None), True)
        except ConfigError:
            return  # the file changed since it was checked: what was read is written

    def _write(self, req: Request, ending: str, now: float) -> None:
        fmt = batch_format(req.params)
        if fmt is not None:
            self._write_batch(req, fmt, ending)
            return
        key = req.key  # the key of its latest attempt (None: never sent)
        wall = self.engine.wall_time
        result = req.result
        sent = req.first_sent_at
        record: dict[str, Any] = {
            "id": req.id,
            "key": key,
            "ending": ending,
            "status": req.last_status,
            "attempts": req.attempts,
            "error": req.last_error,
            "created_at": round(wall(req.created_at), 6),
            "intended_at": round(wall(req.intended_at), 6),
            "first_sent_at": round(wall(sent), 6) if sent is not None else None,
            "done_at": round(wall(now), 6) if ending not in ("queued", "in_flight") else None,
            "latency_ms": round(result.latency_s * 1000.0, 3) if isinstance(result, Outcome) else None,
            "total_ms": round((now - req.intended_at) * 1000.0, 3),
            "queue_wait_ms": round((sent - req.created_at) * 1000.0, 3) if sent is not None else None,
            "line_id": self._line_id(req),
            "params": Graveyard.scrub(req.params, self.redact) if req.params else {},
            "pool": req.pool,
        }
        line = line_fields(req)
        if line:
            record["line"] = Graveyard.scrub(line, self.redact)
        if req.request_id is not None:  # the server's id of a write that ended uncertain
            record["request_id"] = req.request_id
        if self.body:
            record["body"] = self._body(result)
        self._put(record, ending != str(Ending.SUCCEEDED))

    def _write_batch(self, req: Request, fmt: BatchFormat, ending: str) -> None:
        """`req`'s line in its batch format's output, once per custom_id."""
        if self.store and ending in ("queued", "in_flight"):
            return  # back to the store: the run that ends it writes it
        custom_id = req.line_id
        if custom_id in self.done:
            return
        self.done.add(custom_id)
        result = req.result
        response = result.response if isinstance(result, Outcome) else None
        request_id = req.request_id or _request_id(response, self.request_id_headers)
        error = self.redact(req.last_error, 500) if req.last_error else None
        body = self._body(result, whole=True) if response is not None else None
        record = output_record(fmt, custom_id, ending, req.last_status, body, request_id, error)
        self._put(record, failed(record))

    def _put(self, record: dict[str, Any], bad: bool) -> None:
        """Write `record` to the errors file when it failed and there is one, else to the results."""
        out = self.errors if bad and self.errors is not None else self.out
        if out is not None and out.problem is None:
            out.write(record)

    def _line_id(self, req: Request) -> Any:
        """The value of the line's `link` field: its `_id`, or one of its own fields."""
        if self.link == "_id":
            value = req.line_id
        else:
            value = req.params.get(self.link) if req.params else None
        return Graveyard.scrub(value, self.redact)

    def _body(self, result: Any, whole: bool = False) -> Any:
        """The answer's body: parsed when it is JSON (up to `RESULTS_BODY_CHARS`, or any size when
        `whole`: a batch output line carries the whole answer), else text cut to that size."""
        response = result.response if isinstance(result, Outcome) else None
        raw: Any = response.body if isinstance(response, Response) else None
        if isinstance(raw, bytes | bytearray):
            raw = bytes(raw).decode("utf-8", "replace")
        if not isinstance(raw, str):
            return None
        assert isinstance(response, Response)
        if (whole or len(raw) <= RESULTS_BODY_CHARS) and _is_json(response.headers):
            try:
                parsed = json.loads(raw)
            except ValueError:
                pass
            else:  # the whole answer, every string in it masked
                return Graveyard.scrub(parsed, self.redact)
        return self.redact(raw, RESULTS_BODY_CHARS)

    def close(self) -> None:
        for f in (self.out, self.errors):
            if f is not None:
                f.close()


#: The headers a server names its answer by (OpenAI's, Anthropic's and Stripe's), after the target's own.
REQUEST_ID_HEADERS = ("x-request-id", "request-id")


def _request_id(response: Any, names: tuple[str, ...]) -> str | None:
    """The server's id of an answer, from the first of the headers `names` it has; None if none."""
    headers = getattr(response, "headers", None)
    if headers is None:
        return None
    for name in names:
        try:
            value = headers.get(name) or headers.get(name.lower())
        except AttributeError:
            return None
        if value:
            return "".join(c for c in str(value) if c.isprintable())[:200]
    return None


def cut_partial_line(path: str) -> None:
    """Cut off the last line of a JSONL file when a kill -9 left it short, so the next line
    written starts on a line of its own (only the file's tail is read)."""
    p = Path(path)
    try:
        with p.open("r+b") as fh:
            size = fh.seek(0, 2)
            if size == 0:
                return
            fh.seek(size - 1)
            if fh.read(1) == b"\n":
                return
            at = size
            while at > 0:  # back, a block at a time, to the last newline
                start = max(0, at - 65536)
                fh.seek(start)
                block = fh.read(at - start)
                nl = block.rfind(b"\n")
                if nl >= 0:
                    fh.truncate(start + nl + 1)
                    return
                at = start
            fh.truncate(0)
    except OSError:
        return  # no file yet, or not ours to mend: JsonLines says what it cannot write


def written_custom_ids(path: str) -> set[Any]:
    """The custom_ids of the batch lines in a results file a killed run left (none if it has none)."""
    ids: set[Any] = set()
    try:
        with Path(path).open(encoding="utf-8", errors="replace") as fh:
            for line in fh:
                try:
                    record = json.loads(line)
                except ValueError:
                    continue
                if isinstance(record, dict) and "custom_id" in record:
                    ids.add(record["custom_id"])
    except OSError:
        pass
    return ids


def _is_json(headers: Any) -> bool:
    """Whether an answer's Content-Type says JSON (application/json, or a +json type)."""
    try:
        kind = str(headers.get("Content-Type") or headers.get("content-type") or "")
        kind = kind.partition(";")[0].strip().lower()
    except AttributeError:
        return False
    return kind == "application/json" or kind.endswith("+json")
