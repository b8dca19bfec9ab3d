"""Where requests come from: a generator at an arrival rate, or a JSONL file."""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from ratedeck.core.vocab import Arrival

from .request import Request, Shape
from .settings import ConfigError, EngineSettings
from .waker import Waker

if TYPE_CHECKING:
    from .ports import SourceSink
    from .snapshot import MessageStats


class Workload:
    """A `Source` of requests at `rate` per second (constant spacing or Poisson).

    With backpressure on it waits while the main queue is full, so nothing is
    dropped; with it off the queue grows and TTLs expire. `items` (from a
    file) supplies per-request parameters; `total` caps the count. When
    either runs out, `exhausted` becomes true.
    """

    def __init__(
        self,
        rate: float,
        *,
        poisson: bool = False,
        total: int | None = None,
        items: Iterator[dict] | None = None,
        rng: random.Random | None = None,
    ):
        self.rate = float(rate)
        self.poisson = poisson
        self.total = total
        self.items = items
        self.rng = rng or random.Random()
        self.exhausted = False
        self._waker = Waker()

    @classmethod
    def from_config(cls, cfg: EngineSettings, rng: random.Random) -> Workload:
        w = cfg.workload
        items = read_jsonl(w.file, tuple(cfg.pools), tuple(b.name for b in cfg.budgets)) if w.file else None
        return cls(
            cfg.arrival_rate, poisson=w.arrival == Arrival.POISSON, total=w.total, items=items, rng=rng
        )

    def set_rate(self, rate: float) -> None:
        self.rate = float(rate)
        self.poke()

    def set_throttle(self, value: str | float) -> None:
        raise ValueError("the entry throttle needs a message workload ([messages] in the config)")

    def made(self, req: Request) -> None:
        """`req` was just made from the next item, before it is submitted (a store ties it to its job)."""

    def poke(self) -> None:
        self._waker.poke()

    def close_second(self) -> None:
        pass

    def stats(self, elapsed_s: float) -> MessageStats | None:
        return None

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
            if self.rate <= 0:
                await self._sleep(loop, None)
                next_t = sink.clock()
                continue
            if sink.backpressure and queues.fresh() >= sink.queue_max:
                await queues.wait_space(sink.queue_max)
                continue
            now = sink.clock()
            if next_t > now:
                await self._sleep(loop, next_t)
                continue
            params = None
            if self.items is not None:
                params = next(self.items, None)
                if params is None:
                    if await self.refill():
                        continue
                    break
            pool = params.pop("_pool", None) if params else None
            shape = take_shape(params) if params else None
            if self.rate != scheduled_rate:
                intended, scheduled_rate = now, self.rate
            req = sink.new_request(params, pool=pool, intended_at=min(intended, now))
            req.shape = shape
            self.made(req)
            sink.submit(req)
            made += 1
            gap = self.rng.expovariate(self.rate) if self.poisson else 1.0 / self.rate
            intended += gap
            # After a stall (backpressure, rate 0) do not burst to catch up.
            next_t = max(next_t + gap, now - 0.05)
        self.exhausted = True
        sink.source_done()


_SHAPE_FIELDS = ("_method", "_path", "_body", "_weight", "_budget")
_METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")


def take_shape(params: dict) -> Shape | None:
    """Pop a line's `_method`, `_path`, `_body`, `_weight` and `_budget` (checked by `read_jsonl`)."""
    if not any(name in params for name in _SHAPE_FIELDS):
        return None
    budget = params.pop("_budget", ())
    method = params.pop("_method", None)
    return Shape(
        method=method.upper() if method else None,
        path=params.pop("_path", None),
        body=params.pop("_body", None),
        weight=params.pop("_weight", 1),
        budgets=(budget,) if isinstance(budget, str) else tuple(budget),
    )


def _check_shape(obj: dict, budgets: tuple[str, ...]) -> str | None:
    """What is wrong with a line's shaping fields, or None."""
    method = obj.get("_method")
    if method is not None and (not isinstance(method, str) or method.upper() not in _METHODS):
        return f"_method must be one of {', '.join(_METHODS)}, got {method!r}"
    path = obj.get("_path")
    if path is not None and (
        not isinstance(path, str) or not path.startswith("/") or any(c in path for c in "\r\n ")
    ):
        return f"_path must be a path starting with /, got {path!r}"
    body = obj.get("_body")
    if body is not None and body not in ("form", "json"):
        return f'_body must be "form" or "json", got {body!r}'
    weight = obj.get("_weight", 1)
    if isinstance(weight, bool) or not isinstance(weight, int) or not 1 <= weight <= 1_000_000:
        return f"_weight must be a whole number from 1 to 1,000,000, got {weight!r}"
    names = obj.get("_budget", ())
    names = (names,) if isinstance(names, str) else names
    if not isinstance(names, (list, tuple)) or not all(isinstance(n, str) for n in names):
        return f"_budget must be a budget name or a list of them, got {obj.get('_budget')!r}"
    for name in names:
        if name not in budgets:
            known = ", ".join(budgets) if budgets else "none are configured ([[budgets]] in the config)"
            return f"_budget {name!r} is not a budget; budgets: {known}"
    return None


def read_jsonl(path: str, pools: tuple[str, ...] = (), budgets: tuple[str, ...] = ()) -> Iterator[dict]:
    """Check a JSONL workload file up front, then yield its objects one by one.

    Every line must be a JSON object. Its fields become request parameters,
    except `_pool` (a connection pool) and the shaping fields: `_method`,
    `_path` (joined to the target URL), `_body` ("form" or "json"),
    `_weight` (what it costs in weight budgets) and `_budget` (named budgets
    it also spends from). A bad line is reported with its number before the
    run starts.
    """
    p = Path(path)
    try:
        lines = p.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(str(p), "workload.file", f"cannot read: {exc}") from None
    items = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ConfigError(str(p), f"line {n}", f"not JSON ({exc.msg})") from None
        if not isinstance(obj, dict):
            raise ConfigError(str(p), f"line {n}", "must be a JSON object of request parameters")
        pool = obj.get("_pool")
        if pool is not None and pool not in pools:
            known = ", ".join(pools) if pools else "none are configured ([pools] in the config)"
            raise ConfigError(str(p), f"line {n}", f"_pool {pool!r} is not a pool; pools: {known}")
        problem = _check_shape(obj, budgets)
        if problem is not None:
            raise ConfigError(str(p), f"line {n}", problem)
        items.append(obj)
    return iter(items)
