"""`ratedeck enqueue --store URL FILE`: a JSONL workload's lines (or a batch file's) added to a store as jobs."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import sys

from ratedeck.config import ConfigError, RunConfig, load_config
from ratedeck.core.exits import ExitCode
from ratedeck.engine.sources.workload import KeyPins, LineRules, names_no_path, read_jsonl
from ratedeck.store import StoreError
from ratedeck.store.work import open_for_run

from .common import fail, parse_args


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ratedeck enqueue",
        description="Check a JSONL workload (one object of parameters per line, as a workload file is read, or an"
        " OpenAI Batch or Anthropic Message Batches file as it is) and add every line to a store as a job, all"
        " or none. 'ratedeck --store URL' then works the store (--results answers a batch file's lines in its"
        " API's output format).",
    )
    p.add_argument(
        "--store",
        metavar="URL",
        required=True,
        help="sqlite:PATH, redis://host:port/db or redis+cluster://host:port,host:port",
    )
    p.add_argument("--config", metavar="FILE", help="the run's config: the pools and budgets lines may name")
    p.add_argument("--preset", metavar="NAME", help="the run's preset (pools and budgets)")
    p.add_argument("file", metavar="FILE", help="JSONL workload file, or a provider's batch input file")
    return p


def main(argv: list[str]) -> int:
    parsed = parse_args(build_parser(), argv)
    if isinstance(parsed, int):
        return parsed
    args = parsed
    try:
        cfg, pins = _load(args)
        # The run's target may name the endpoint a line without `_path` needs: counted below, not refused.
        rules = dataclasses.replace(LineRules.of(cfg.engine_settings, pins), rootless=None)
        items = list(read_jsonl(args.file, rules))
        if cfg.runner.store.strip() == "memory":
            raise ConfigError(
                "command line", "--store", "memory keeps nothing: use sqlite:PATH or redis://..."
            )
        store = open_for_run(cfg.runner, cfg.engine_settings)
    except ConfigError as exc:
        return fail(str(exc))
    assert store is not None

    async def add() -> tuple[int, int]:
        try:
            added = await store.enqueue(items)
            return added, (await store.counts()).pending
        finally:
            await store.close()

    try:
        added, pending = asyncio.run(add())
    except StoreError as exc:
        return fail(f"enqueue: {store.url}: nothing added: {exc}")
    print(f"ratedeck: enqueued {added} jobs from {args.file} into {store.url} ({pending} pending)")
    target = cfg.engine_settings.target
    bare = sum(1 for item in items if "_path" not in item) if target.path_required else 0
    if bare and (not target.url or names_no_path(target.url)):
        # The run's target is not known here (or names no endpoint): said now, refused then.
        print(
            f"ratedeck: note: jobs without a _path: {bare}; a run refuses them unsent unless its"
            " --target is the endpoint's whole URL (target.path_required)",
            file=sys.stderr,
        )
    return ExitCode.OK


def _load(args: argparse.Namespace) -> tuple[RunConfig, KeyPins]:
    """The config, read once, and what a line's `_key` may name. Enqueueing sends nothing, so a
    config need not name keys: when it does, `_key` is checked against them, else by its form
    (the run checks it against its own keys when it reads the job)."""
    overrides = {"run": {"store": args.store}}
    if args.config or args.preset:
        try:
            cfg = load_config(args.config, args.preset, overrides)
            return cfg, KeyPins(cfg.engine_settings.keys)
        except ConfigError as exc:
            if not (exc.key.startswith("keys") or exc.key == "--keys"):
                raise  # not about the keys: the same problem without them
    return load_config(args.config, args.preset, overrides, keys_needed=False), KeyPins()
