"""Where requests come from: a generator at an arrival rate, or a job (a JSONL file, a store).

A job with no arrival rate of its own (`--rate`) is *fed*: its queued work is
always waiting, so the limiter is the only brake and a bucket's burst or a
fixed window's spare quota gets used. The main queue's size (`queue_max`)
bounds what is held, and a file is read a line at a time.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from ratedeck.core.secrets import fingerprint, safe_url
from ratedeck.core.vocab import Arrival
from ratedeck.engine.limits.waker import Waker
from ratedeck.engine.llm.batch import (
    BATCH_FIELD,
    BatchFormat,
    BatchLineError,
    batch_format,
    format_of,
    translate,
)
from ratedeck.engine.path.lanes import lane_model
from ratedeck.engine.request import Request, Shape
from ratedeck.engine.settings import ConfigError, EngineSettings, KeySpec

if TYPE_CHECKING:
    from ratedeck.engine.ports import SourceSink
    from ratedeck.engine.snapshot import MessageStats


class Workload:
    """A `Source` of requests at `rate` per second (constant spacing or Poisson).

    With backpressure on it waits while the main queue is full, so nothing is
    dropped; with it off the queue grows and TTLs expire. `items` (from a
    file) supplies per-request parameters; `total` caps the count. When
    either runs out, `exhausted` becomes true.

    `fed` (a job with no arrival rate): no schedule at all; the main queue is
    kept full (backpressure or not, so memory stays bounded by `queue_max`)
    and the key workers take work as fast as their limits allow. `rate` then
    only says where `set_rate` (the console's arrival keys) starts from; a
    rate set by a command turns the job into a paced load test.
    """

    clients = False  # the user's own work: its graveyard goes where the run puts it

    def __init__(
        self,
        rate: float,
        *,
        poisson: bool = False,
        total: int | None = None,
        items: Iterator[dict] | None = None,
        rng: random.Random | None = None,
        fed: bool = False,
        depth: int | None = None,
        rules: LineRules | None = None,
    ):
        self.rate = float(rate)
        self.fed = fed
        # The most queued at once, if less than queue_max: a fed job's `fed_depth`, or a
        # store's few jobs marked ahead of the limiter (store/work.py lowers it).
        self.depth = depth
        # What a line may name and send; a store's jobs are checked against it as they are taken
        # (a file's lines were, before the run).
        self.rules = rules or LineRules()
        self.poisson = poisson
        self.total = total
        self.items = items
        self.rng = rng or random.Random()
        self.exhausted = False
        # How many items `items` holds in all when known (a file's lines; a store's pending jobs).
        self.size = items.count if isinstance(items, CountedLines) else None
        self.models = items.models if isinstance(items, CountedLines) else None  # lines per model
        self._waker = Waker()
        # True when `before_submit` must run (and be awaited) before each request is queued.
        self.marks = False
        self.capped = False  # the cost cap stopped it (`SourceSink.admit_spend`): lines were left

    @classmethod
    def from_config(cls, cfg: EngineSettings, rng: random.Random) -> Workload:
        w = cfg.workload
        rules = LineRules.of(cfg)
        # With limits per model, the check pass counts each model's lines (the ETA's least time).
        per_model = cfg.key_per_model or any(b.per_model for b in cfg.budgets)
        model_field = cfg.target.model_field if per_model else None
        items = read_jsonl(w.file, rules, model_field=model_field) if w.file else None
        return cls(
            cfg.arrival_rate,
            poisson=w.arrival == Arrival.POISSON,
            total=w.total,
            items=items,
            rng=rng,
            fed=items is not None and w.rate is None,
            depth=fed_depth(cfg),
            rules=rules,
        )

    @property
    def job(self) -> bool:
        """Whether the work is a job (a file's lines, a store's jobs), not a generated stream."""
        return self.items is not None

    @property
    def job_total(self) -> int | None:
        """The work's size when known: the file's lines or the store's pending jobs (`size`), at
        most `total`; None for an endless stream."""
        sizes = [n for n in (self.size, self.total) if n is not None]
        return min(sizes) if sizes else None

    @property
    def job_models(self) -> dict[str, int] | None:
        """The file's lines per model lane (`lanes.lane_model`), counted in its check pass when
        the limits hold per model; None otherwise (a store's jobs, a stream)."""
        return self.models

    def set_rate(self, rate: float) -> None:
        self.rate = float(rate)
        self.fed = False  # a rate asked for is an arrival rate: a load test from now on
        self.poke()

    def set_throttle(self, value: str | float) -> None:
        raise ValueError("the entry throttle needs a message workload ([messages] in the config)")

    def made(self, req: Request) -> None:
        """`req` was just made from the next item, before it is submitted (a store ties it to its job)."""

    def unmade(self, req: Request) -> None:
        """`req` was made but will never be queued (the cost cap): a store gives its job back."""

    def poke(self) -> None:
        self._waker.poke()

    def close_second(self) -> None:
        pass

    def stats(self, elapsed_s: float) -> MessageStats | None:
        return None

    async def before_submit(self, req: Request, sink: SourceSink) -> bool:
        """Called (when `marks`) before `req` is queued: False to stop making requests."""
        return True

    async def refill(self) -> bool:
        """`items` ran out: fetch more (a store claims a batch); False when there is no more work."""
        return False

    async def _sleep(self, loop: asyncio.AbstractEventLoop | None, until: float | None) -> None:
        await self._waker.wait(loop, until)

    async def run(self, sink: SourceSink) -> None:
        loop = sink.loop
        queues = sink.queues
        made = 0
        next_t = sink.clock()
        # The schedule a fixed arrival rate promises: it never skips ahead after a
        # stall, so latency from arrival counts the time backpressure held a
        # request back (what wrk2 calls coordinated omission). A new rate starts
        # a new schedule.
        intended, scheduled_rate = next_t, self.rate
        while not sink.stopping:
            if self.total is not None and made >= self.total:
                break
            if not self.fed and self.rate <= 0:
                await self._sleep(loop, None)
                next_t = sink.clock()
                continue
            # A fed job keeps queued work always waiting (the limiter is the only brake), bounded
            # as backpressure bounds a paced source.
            if self.fed or sink.backpressure:
                limit = sink.queue_max if self.depth is None else min(self.depth, sink.queue_max)
                if queues.fresh() >= limit:
                    await queues.wait_space(limit)
                    continue
            now = sink.clock()
            if not self.fed and next_t > now:
                await self._sleep(loop, next_t)
                continue
            params = pool = pin = line_id = shape = None
            if self.items is not None:
                params = next(self.items, None)
                if params is None:
                    if await self.refill():
                        continue
                    break
                if params:
                    pool = params.pop("_pool", None)
                    pin = params.pop("_key", None)
                    line_id = params.pop("_id", None)
                    shape = take_shape(params)
            if self.fed:
                intended, next_t = now, now  # no schedule: it arrives when there is room
            elif self.rate != scheduled_rate:
                intended, scheduled_rate = now, self.rate
            req = sink.new_request(params, pool=pool, intended_at=min(intended, now))
            if shape is not None:
                req.shape = shape
            if line_id is not None:
                req.line_id = line_id
            self.made(req)
            if sink.spend_gate and not await sink.admit_spend(req):
                self.capped = True
                self.unmade(req)
                break
            if self.marks and not await self.before_submit(req, sink):
                break
            rules = self.rules
            if rules.signed and shape is not None and shape.verbatim:  # a store's job, checked now
                req.last_error = UNSIGNABLE
                sink.problem(f"a job's {UNSIGNABLE}")
                sink.refuse(req)
            elif (
                rules.rootless is not None
                and self.items is not None
                and (shape is None or shape.path is None)
            ):
                # a store's job, checked now (a file's lines were, before the run)
                req.last_error = no_path(rules.rootless)
                sink.problem(f"a job has {req.last_error}: refused")
                sink.refuse(req)
            elif pin is None:
                sink.submit(req)
            elif (label := rules.pins.label(pin)) is not None:
                req.pin = label  # this key sends it, and only this key
                sink.submit(req)
            else:  # a store's job, checked now: refused, never sent on another key
                pins = rules.pins
                req.last_error = f"_key {pins.show(pin)} names none of the keys {pins.known()}"
                sink.problem(f"a job's {req.last_error}: refused")
                sink.refuse(req)
            made += 1
            if self.fed:
                continue
            gap = self.rng.expovariate(self.rate) if self.poisson else 1.0 / self.rate
            intended += gap
            # After a stall (backpressure, rate 0) do not burst to catch up.
            next_t = max(next_t + gap, now - 0.05)
        self.exhausted = True
        sink.source_done()


#: A TTL at least this long never binds a job: it is fed as if requests never expired.
LONG_TTL_S = 3600.0


def fed_depth(cfg: EngineSettings) -> int | None:
    """How much of a fed job may wait queued when requests expire (`engine.ttl_s` set, and
    shorter than `LONG_TTL_S`): what the keys send in half the TTL, so the last one queued still goes in
    time. None: no bound beyond the queue's own."""
    ttl = cfg.engine.ttl_s
    if ttl is None or not math.isfinite(ttl) or ttl >= LONG_TTL_S:
        return None
    return max(1, math.floor(0.5 * cfg.capacity_tps * ttl))


def bursts_in_time(cfg: EngineSettings) -> bool:
    """Whether a fed job may send in bursts: what waits behind a burst waits up to a window,
    so the TTL must be at least twice the longest window (buckets drain as they go)."""
    ttl = cfg.engine.ttl_s
    policies = [p for k in cfg.keys for p in k.policies] + list(cfg.host_policies)
    policies += [p for b in cfg.budgets for p in b.policies]
    longest = max((p.window_s for p in policies if p.is_window), default=0.0)
    return ttl is None or not math.isfinite(ttl) or ttl >= LONG_TTL_S or ttl >= 2 * longest


class KeyPins:
    """What a workload line's `_key` may name: a key's index (1 for k1), label ("k2") or
    fingerprint as the console shows it ("3f9a1c"); never its secret.

    With no keys (`ratedeck enqueue` without a config), only the form is checked:
    the run checks the names when it reads the job.
    """

    _FORM = re.compile(r"k[1-9][0-9]{0,5}|[0-9a-f]{6}")  # a label (always k<n>) or a fingerprint

    def __init__(self, keys: Sequence[KeySpec] = ()):
        self.labels = tuple(k.label for k in keys)
        self._names: dict[str, str] = {}
        for k in keys:
            fp = fingerprint(k.secret)
            if fp:
                self._names.setdefault(fp, k.label)
        for k in keys:
            self._names[k.label] = k.label
        self._secrets = tuple(s for k in keys for s in (k.secret, k.api_secret) if s)

    def label(self, value: object) -> str | None:
        """The label of the key `value` names; None if it names none."""
        if isinstance(value, bool):
            return None
        if isinstance(value, int):  # 2 is k2, the console's label, whichever keys this engine has
            return self._names.get(f"k{value}") if value >= 1 else None
        if isinstance(value, str):
            return self._names.get(value)
        return None

    def problem(self, value: object) -> str | None:
        """What is wrong with a line's `_key`, in a line that never shows a secret; None if nothing."""
        if isinstance(value, str) and any(s and s in value for s in self._secrets):
            return (
                "_key holds an API key's secret (not shown); name the key by its label, index or fingerprint"
            )
        if not self.labels:  # the keys are not known here: the form only
            ok = (isinstance(value, int) and not isinstance(value, bool) and value >= 1) or (
                isinstance(value, str) and self._FORM.fullmatch(value) is not None
            )
            if ok:
                return None
            return (
                f"_key must be a key's index (2), label (k2) or fingerprint (3f9a1c), got {self.show(value)}"
            )
        if self.label(value) is not None:
            return None
        return f"_key {self.show(value)} names none of the keys {self.known()}"

    def known(self) -> str:
        n = len(self.labels)
        if not n:
            return "(none configured)"
        return f"{', '.join(self.labels[:5])}{', ...' if n > 5 else ''} (index 1 to {n}, or a fingerprint)"

    def show(self, value: object) -> str:
        """`value` fit for a message: a long string may be a secret, so only its length is shown."""
        if isinstance(value, str) and (len(value) > 16 or not value.isprintable()):
            return f"(a value of {len(value)} characters, not shown)"
        return repr(value)


_SHAPE_FIELDS = ("_method", "_path", "_body", "_weight", "_budget")
_METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")


def take_shape(params: dict) -> Shape | None:
    """Pop a line's `_method`, `_path`, `_body`, `_weight` and `_budget` (checked by `read_jsonl`).

    An object `_body` is the body itself: POST unless `_method` says otherwise, its JSON
    encoded here, once for every attempt."""
    if not any(name in params for name in _SHAPE_FIELDS):
        return None
    budget = params.pop("_budget", ())
    method = params.pop("_method", None)
    body = params.pop("_body", None)
    verbatim = isinstance(body, dict | list)
    if verbatim and not method:
        method = "POST"
    return Shape(
        method=method.upper() if method else None,
        path=params.pop("_path", None),
        body=body,
        weight=params.pop("_weight", 1),
        budgets=(budget,) if isinstance(budget, str) else tuple(budget),
        payload=Shape.encode(body) if verbatim else None,
    )


@dataclass(frozen=True)
class LineRules:
    """What a workload line may name and send, from the run's config: the pools of `_pool`, the
    budgets of `_budget`, the keys of `_key` (`pins`), whether the target signs its requests
    (`signed`: an object `_body`, sent as it is, cannot go) and the target URL a line without
    `_path` cannot reach (`rootless`, `rootless_url`). The defaults allow what needs no config."""

    pools: tuple[str, ...] = ()
    budgets: tuple[str, ...] = ()
    pins: KeyPins = field(default_factory=KeyPins)
    signed: bool = False
    rootless: str | None = None

    @classmethod
    def of(cls, cfg: EngineSettings, pins: KeyPins | None = None) -> LineRules:
        """The rules of a run of `cfg` (`pins`: the keys `_key` may name, if not `cfg`'s own)."""
        return cls(
            tuple(cfg.pools),
            tuple(b.name for b in cfg.budgets),
            KeyPins(cfg.keys) if pins is None else pins,
            bool(cfg.target.signing),
            rootless_url(cfg),
        )

    def problem(self, obj: dict) -> str | None:
        """What is wrong with a line's fields under these rules, or None."""
        pool = obj.get("_pool")
        if pool is not None and pool not in self.pools:
            known = ", ".join(self.pools) if self.pools else "none are configured ([pools] in the config)"
            return f"_pool {pool!r} is not a pool; pools: {known}"
        problem = self._shape_problem(obj)
        if problem is None and "_key" in obj:
            problem = self.pins.problem(obj["_key"])
        return problem

    def _shape_problem(self, obj: dict) -> str | None:
        """What is wrong with a line's shaping fields under these rules, or None."""
        method = obj.get("_method")
        if method is not None and (not isinstance(method, str) or method.upper() not in _METHODS):
            return f"_method must be one of {', '.join(_METHODS)}, got {method!r}"
        path = obj.get("_path")
        if path is not None and (
            not isinstance(path, str) or not path.startswith("/") or any(c in path for c in "\r\n ")
        ):
            return f"_path must be a path starting with /, got {path!r}"
        if path is None and self.rootless is not None:
            return no_path(self.rootless)
        if "_body" in obj:
            body = obj["_body"]
            if isinstance(body, dict | list):
                if isinstance(method, str) and method.upper() == "GET":
                    return "_method GET cannot send an object _body (POST, PUT, PATCH or DELETE can)"
                if self.signed:
                    return UNSIGNABLE
            elif body not in ("form", "json"):
                return f'_body must be "form", "json" or a JSON object (the body itself), got {_show(body)}'
        weight = obj.get("_weight", 1)
        if isinstance(weight, bool) or not isinstance(weight, int) or not 1 <= weight <= 1_000_000:
            return f"_weight must be a whole number from 1 to 1,000,000, got {weight!r}"
        names = obj.get("_budget", ())
        names = (names,) if isinstance(names, str) else names
        if not isinstance(names, (list, tuple)) or not all(isinstance(n, str) for n in names):
            return f"_budget must be a budget name or a list of them, got {obj.get('_budget')!r}"
        for name in names:
            if name not in self.budgets:
                known = (
                    ", ".join(self.budgets)
                    if self.budgets
                    else "none are configured ([[budgets]] in the config)"
                )
                return f"_budget {name!r} is not a budget; budgets: {known}"
        if BATCH_FIELD in obj and (
            batch_format(obj) is None or not isinstance(obj.get("_body"), dict) or "_id" not in obj
        ):
            return f"{BATCH_FIELD} is what a batch file's line becomes: a format (openai, anthropic) with an object _body and an _id"
        if "_id" in obj:
            return id_problem(obj["_id"])
        return None


def rootless_url(cfg: EngineSettings) -> str | None:
    """The target URL (shown) a job line without `_path` cannot reach: its API answers nothing
    at its root (`target.path_required`) and the URL names no path; None when such a line may go."""
    for target in [e.target for e in cfg.endpoints] or [cfg.target]:
        if target.path_required and target.url and names_no_path(target.url):
            return safe_url(target.url)
    return None


def names_no_path(url: str) -> bool:
    """Whether `url` is an API's root (no path, or "/"): a line without `_path` goes there."""
    return urlsplit(url).path in ("", "/")


def no_path(url: str) -> str:
    """Why a line without `_path` cannot go to `url` (`rootless_url`)."""
    return (
        f"no _path, and the target {url} names no endpoint: its API answers nothing there "
        '(target.path_required); give the line its endpoint ("_path": "/v1/chat/completions", '
        '"/v1/messages", ...) or the endpoint\'s whole URL as --target'
    )


#: Why a line with an object `_body` cannot go to a target that signs its requests.
UNSIGNABLE = "an object _body is sent as it is, and this target signs its requests (target.signing): refused"


def id_problem(value: object) -> str | None:
    """What is wrong with a line's `_id`, or None."""
    if isinstance(value, bool) or not isinstance(value, str | int):
        return f"_id must be a string or a whole number, got {_show(value)}"
    return None


def _show(value: object) -> str:
    text = json.dumps(value) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def read_jsonl(path: str, rules: LineRules | None = None, *, model_field: str | None = None) -> CountedLines:
    """Check a JSONL workload file up front, then yield its objects one by one.

    Every line must be a JSON object. Its fields become request parameters,
    except `_pool` (a connection pool) and the shaping fields: `_method`,
    `_path` (joined to the target URL), `_body` ("form" or "json", or a JSON
    object: the body itself, sent as it is, and then the line's other fields
    are not sent), `_weight` (what it costs in weight budgets), `_budget`
    (named budgets it also spends from), `_key` (the one key that sends it:
    `KeyPins`) and `_id` (a string or number naming the line, unique in the
    file, never sent: a results line carries it). `rules` says which pools,
    budgets and keys lines may name, and what the target cannot take
    (`LineRules`). A bad line is reported with its number before the run starts.

    A provider's batch file (OpenAI Batch input, Anthropic Message Batches requests; the first
    line says which, and every line must agree) is read as it is: each line becomes such a line
    (`batch.translate`), with `_batch` naming its format for the results file. A repeated
    `custom_id` is refused as a repeated `_id` is.

    The file is read twice, a line at a time, and never held: once to check
    every line, then lazily as the run takes work (a file of millions of jobs
    costs the memory of the queue, not of the file; the check pass holds the
    `_id`s, to find a repeated one). The check pass counts the lines: `count`, and with
    `model_field` each model's lines (`models`, by the lane its body spends from).
    """
    ids: dict[object, int] = {}
    count = 0
    models: dict[str, int] | None = {} if model_field else None
    field = tuple(model_field.split(".")) if model_field else ()
    rules = rules or LineRules()
    for obj in _lines(path, rules, ids):
        count += 1
        if models is not None:
            model = lane_model(obj.get("_body"), field)
            models[model] = models.get(model, 0) + 1
    ids.clear()
    return CountedLines(_lines(path, rules), count, models)


class CountedLines(Iterator[dict]):
    """A workload file's objects, read lazily, and how many it holds (`count`, from the check
    pass; `models`: how many per model lane, when counted)."""

    def __init__(self, lines: Iterator[dict], count: int, models: dict[str, int] | None = None):
        self._lines = lines
        self.count = count
        self.models = models

    def __next__(self) -> dict:
        return next(self._lines)


def _lines(path: str, rules: LineRules, ids: dict[object, int] | None = None) -> Iterator[dict]:
    """The file's objects, each checked, read one line at a time (`ids`: the `_id`s seen so far).

    The first line says the file's format: ratedeck's own lines, or a provider's batch file
    (`batch.format_of`), whose lines are translated to ratedeck's own as they are read."""
    p = Path(path)
    first: tuple[int, BatchFormat | None] | None = None  # the first line's number and format
    try:
        with p.open(encoding="utf-8-sig") as f:  # a byte-order mark some editors write is no line's
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                obj = _parsed(p, n, line)
                if first is None:
                    first = (n, format_of(obj))
                obj = _in_format(p, n, obj, *first)
                problem = rules.problem(obj)
                if problem is not None:
                    raise ConfigError(str(p), f"line {n}", problem)
                if ids is not None and "_id" in obj:
                    # 7 and "7" are different ids (JSON's types), as a results line keeps them.
                    seen = ids.setdefault((type(obj["_id"]), obj["_id"]), n)
                    if seen != n:
                        name = "custom_id" if first[1] is not None else "_id"
                        problem = f"{name} {_show(obj['_id'])} is also the {name} of line {seen}: ids must be unique"
                        raise ConfigError(str(p), f"line {n}", problem)
                yield obj
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(str(p), "workload.file", f"cannot read: {exc}") from None


def _parsed(p: Path, n: int, line: str) -> dict:
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ConfigError(str(p), f"line {n}", f"not JSON ({exc.msg})") from None
    if not isinstance(obj, dict):
        raise ConfigError(str(p), f"line {n}", "must be a JSON object of request parameters")
    return obj


def _in_format(p: Path, n: int, obj: dict, first: int, fmt: BatchFormat | None) -> dict:
    """`obj` as ratedeck's own line: a batch file's line translated, checked against line `first`'s format."""
    if fmt is None:
        other = format_of(obj)
        if other is not None:
            problem = (
                f"is {other.shown} line, but line {first} is a ratedeck workload line: one format per file"
            )
            raise ConfigError(str(p), f"line {n}", problem)
        return obj
    other = format_of(obj)
    if other is not None and other is not fmt:
        problem = f"is {other.shown} line, but line {first} makes this {fmt.shown} file: one format per file"
        raise ConfigError(str(p), f"line {n}", problem)
    try:
        return translate(obj, fmt)
    except BatchLineError as exc:
        raise ConfigError(str(p), f"line {n}", f"{exc} (line {first} makes this {fmt.shown} file)") from None
