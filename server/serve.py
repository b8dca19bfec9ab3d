"""`ratedeck serve`: run the simulated API in the foreground until Ctrl-C or SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import re
import secrets
import signal
import socket
import sys
import tomllib
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from ratedeck.core.exits import ExitCode
from ratedeck.core.loops import loop_factory
from ratedeck.core.numbers import MAX_SIM_KEYS, check_simulator_numbers, fraction, latency_range, whole
from ratedeck.core.policy import parse_policy
from ratedeck.core.study_server import STUDY, current_name

from .app import start_server
from .settings import (
    MODES,
    STUDY_KEYS,
    ServerSettings,
    generated_keys,
    parse_other_load,
    standard_settings,
    study_settings,
)


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the `serve` options to `parser`; values are checked later by `run_serve`."""
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--port", default="9999", help="port to listen on (0 picks a free one)")
    parser.add_argument(
        "--mode",
        default="study",
        help="study (like the study's server) or standard; 'seed' is an old name for study",
    )
    parser.add_argument("--config", help="TOML file with server settings; options override it")
    parser.add_argument("--keys", help="how many keys (N) or a comma-separated list of keys")
    parser.add_argument(
        "--limit", action="append", metavar="N/W", help="per-key limit like 20/1s (repeatable)"
    )
    parser.add_argument(
        "--host-limit",
        action="append",
        metavar="N/W",
        help="limit shared by all keys, like 500/1s (repeatable)",
    )
    parser.add_argument("--latency", metavar="LOW:HIGH", help="simulated ms each way, like 0:50 or 0")
    parser.add_argument("--latency-in", metavar="LOW:HIGH", help="simulated ms on the way in only")
    parser.add_argument("--latency-out", metavar="LOW:HIGH", help="simulated ms on the way back only")
    parser.add_argument(
        "--processing",
        metavar="LOW:HIGH",
        help="server time in ms between the arrival stamp and the answer, like 20:80 "
        "(requests that spent a slot; it moves no stamp)",
    )
    parser.add_argument(
        "--server-timing",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="send Server-Timing: app;dur=X (ms from the arrival stamp to the answer)",
    )
    parser.add_argument(
        "--health",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="serve GET /health: no key, no limit, network latency only (a probe's target)",
    )
    parser.add_argument(
        "--retry-after",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="send Retry-After on 429 and 503",
    )
    parser.add_argument(
        "--ratelimit-headers",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="send RateLimit-Policy, RateLimit and X-RateLimit-* headers",
    )
    parser.add_argument(
        "--escalation",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="a rejected key cools down; retrying during the cooldown doubles it",
    )
    parser.add_argument(
        "--nonce",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="require a strictly increasing integer nonce per key",
    )
    parser.add_argument("--block-after", metavar="N", help="block a key after N rejections (0 never)")
    parser.add_argument("--error-rate", metavar="F", help="fraction of accepted requests answered 503")
    parser.add_argument("--seed", metavar="N", help="seed for the latency and fault draws")
    parser.add_argument(
        "--other-load",
        metavar="N/W@START-END",
        help="another user of every key, e.g. 8/1s@10s-30s (from the first request): it takes "
        "the keys' slots, never their cooldowns, and is not in the stats",
    )
    parser.add_argument(
        "--allow-reset",
        action="store_true",
        help="turn on POST /reset (clear all state); it then needs the header X-Reset-Token "
        "with the token printed at start (without this option /reset answers 403)",
    )


def settings_from_args(args: argparse.Namespace) -> ServerSettings:
    """The settings the options describe; raises ValueError with a message naming the option."""
    base = _base_settings(args)
    changes: dict[str, Any] = {}
    if args.keys is not None:
        changes["keys"] = _parse_keys(args.keys, base.mode)
    if args.limit:
        changes["policies"] = tuple(_option("--limit", parse_policy, v) for v in args.limit)
    if args.host_limit:
        changes["host_policies"] = tuple(_option("--host-limit", parse_policy, v) for v in args.host_limit)
    if args.latency is not None:
        latency = _option("--latency", _parse_latency, args.latency)
        changes["latency_in_ms"] = changes["latency_out_ms"] = latency
    if args.latency_in is not None:
        changes["latency_in_ms"] = _option("--latency-in", _parse_latency, args.latency_in)
    if args.latency_out is not None:
        changes["latency_out_ms"] = _option("--latency-out", _parse_latency, args.latency_out)
    if args.processing is not None:
        changes["processing_ms"] = _option("--processing", _parse_latency, args.processing)
    for name in ("retry_after", "ratelimit_headers", "escalation", "nonce", "server_timing", "health"):
        value = getattr(args, name)
        if value is not None:
            changes[name] = value
    if args.block_after is not None:
        changes["block_after"] = _option("--block-after", _parse_count, args.block_after)
    if args.error_rate is not None:
        changes["error_rate"] = _option("--error-rate", _parse_fraction, args.error_rate)
    if args.other_load is not None:
        _option("--other-load", _parse_other_load, args.other_load)
        changes["other_load"] = args.other_load
    if args.seed is not None:
        changes["seed"] = _option("--seed", lambda v: whole(v, low=None, high=None), args.seed)
    return replace(base, **changes)


def run_serve(args: argparse.Namespace) -> int:
    """Serve until interrupted; 0 on a clean stop, 2 on bad options, 1 if it cannot listen."""
    try:
        settings = settings_from_args(args)
        port = _option("--port", _parse_port, args.port)
        host = _option("--host", _parse_host, args.host)
    except ValueError as exc:
        print(f"ratedeck serve: error: {exc}", file=sys.stderr)
        return ExitCode.USAGE
    try:
        with asyncio.Runner(loop_factory=loop_factory("uvloop")) as runner:
            reset_token = secrets.token_urlsafe(16) if getattr(args, "allow_reset", False) else None
            return runner.run(_serve_forever(settings, host, port, reset_token))
    except KeyboardInterrupt:
        return ExitCode.OK  # a second Ctrl-C during shutdown: still quiet


async def _serve_forever(
    settings: ServerSettings, host: str, port: int, reset_token: str | None = None
) -> int:
    problem = await _lookup_problem(host, port)
    if problem is not None:
        print(f"ratedeck serve: error: --host: {problem}", file=sys.stderr)
        return ExitCode.USAGE
    try:
        server = await start_server(settings, host, port, reset_token=reset_token)
    except OSError as exc:
        print(
            f"ratedeck serve: error: cannot listen on {host}:{port}: {exc.strerror or exc}", file=sys.stderr
        )
        return ExitCode.FAILED
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(signum, stop.set)
    print(
        f"ratedeck serve: {server.url} ({settings.mode} mode, {len(settings.keys)} keys)",
        flush=True,
    )
    if reset_token is not None:
        print(f"ratedeck serve: POST /reset with the header X-Reset-Token: {reset_token}", flush=True)
    try:
        await stop.wait()
    finally:
        await server.close()
    return ExitCode.OK


def _base_settings(args: argparse.Namespace) -> ServerSettings:
    args.mode = current_name("mode", args.mode)
    if args.mode not in MODES:
        raise ValueError(f"--mode: must be study or standard, got {args.mode!r}")
    if args.config:
        try:
            with open(args.config, "rb") as file:
                data = tomllib.load(file)
        except OSError as exc:
            raise ValueError(f"--config: cannot read {args.config}: {exc.strerror or exc}") from None
        except tomllib.TOMLDecodeError as exc:
            raise ValueError(f"--config: cannot read {args.config}: not valid TOML ({exc})") from None
        except UnicodeDecodeError:
            raise ValueError(f"--config: cannot read {args.config}: not UTF-8 text") from None
        data.setdefault("mode", args.mode)
        try:
            check_simulator_numbers(data)  # NaN, negative or absurd numbers, before the settings see them
            return ServerSettings.from_dict(data)
        except (ValueError, TypeError) as exc:
            raise ValueError(f"--config {args.config}: {exc}") from None
    return study_settings() if args.mode == STUDY else standard_settings()


def _parse_other_load(text: str) -> object:
    try:
        return parse_other_load(text)
    except ValueError as exc:
        raise ValueError(str(exc).removeprefix("other_load: ")) from None


def _option(flag: str, parse: Callable[[str], Any], text: str) -> Any:
    """Run one parser, prefixing any complaint with the option's name."""
    try:
        return parse(text)
    except ValueError as exc:
        raise ValueError(f"{flag}: {exc}") from None


def _parse_keys(text: str, mode: str) -> tuple[str, ...]:
    text = text.strip()
    if text.isascii() and text.isdigit():
        try:
            count = whole(text, low=1, high=MAX_SIM_KEYS)
        except ValueError as exc:
            raise ValueError(f"--keys: a count of keys {exc}") from None
        if mode == STUDY:
            if not 1 <= count <= len(STUDY_KEYS):
                raise ValueError(
                    f"--keys: study mode has {len(STUDY_KEYS)} keys, got {count}; use --mode standard for more"
                )
            return STUDY_KEYS[:count]
        if count < 1:
            raise ValueError(f"--keys: need at least one key, got {text!r}")
        return generated_keys(count)
    keys = tuple(k.strip() for k in text.split(",") if k.strip())
    if not keys:
        raise ValueError(f"--keys: expected a count or a comma-separated list, got {text!r}")
    return keys


def _parse_latency(text: str) -> tuple[int, int]:
    """LOW:HIGH (or one value) whole milliseconds, 0 <= LOW <= HIGH <= 60000."""
    low_text, sep, high_text = text.partition(":")
    try:
        return latency_range((low_text, high_text if sep else low_text))
    except ValueError as exc:
        raise ValueError(f"expected LOW:HIGH whole milliseconds like 0:50, got {text!r} ({exc})") from None


def _parse_count(text: str) -> int:
    return whole(text, low=0)


def _parse_fraction(text: str) -> float:
    return fraction(text, allow_zero=True)


#: How long a --host name may take to resolve before the command gives up on it.
LOOKUP_TIMEOUT_S = 3.0
_HOST_NAME = re.compile(
    r"(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*\.?"
)


def _parse_host(text: str) -> str:
    """An IP address or a host name; a dotted number that is no address (999.1.1.1) is refused here,
    before a resolver could spend its whole timeout on it."""
    text = str(text).strip()
    try:
        return str(ipaddress.ip_address(text.strip("[]")))
    except ValueError:
        pass
    if not _HOST_NAME.fullmatch(text) or text.replace(".", "").isdigit():
        raise ValueError(f"not an IP address or a host name: {text!r}")
    return text


async def _lookup_problem(host: str, port: int) -> str | None:
    """Why `host` cannot be listened on (no address, or no answer within LOOKUP_TIMEOUT_S), else None."""
    try:
        ipaddress.ip_address(host)
        return None
    except ValueError:
        pass
    loop = asyncio.get_running_loop()
    try:
        infos = await asyncio.wait_for(
            loop.getaddrinfo(host, port, type=socket.SOCK_STREAM), LOOKUP_TIMEOUT_S
        )
    except TimeoutError:
        return f"{host!r} did not resolve within {LOOKUP_TIMEOUT_S:g} s"
    except OSError as exc:
        return f"cannot resolve {host!r}: {exc.strerror or exc}"
    return None if infos else f"{host!r} resolves to no address"


def _parse_port(text: str) -> int:
    try:
        return whole(text, low=0, high=65535)
    except ValueError as exc:
        raise ValueError(f"a port number 0..65535: {exc}") from None


def main(argv: list[str] | None = None) -> int:
    """Stand-alone entry point: `python -m ratedeck.server.serve --port 9999`."""
    parser = argparse.ArgumentParser(prog="ratedeck serve", description=__doc__)
    add_serve_arguments(parser)
    return run_serve(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
