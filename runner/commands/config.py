"""`ratedeck config path [--themes]` and `ratedeck config show [run flags]`."""

from __future__ import annotations

import sys

import tomli_w

from ratedeck.config import ConfigError, RunConfig, to_toml_dict
from ratedeck.core.exits import ExitCode
from ratedeck.core.paths import user_config_path, user_themes_dir
from ratedeck.core.secrets import Redactor, mask_secret, masked_password, safe_url
from ratedeck.core.version import version

from ..cli import build_parser as run_parser
from .common import fail, parse_args
from .run import plan_run

USAGE = (
    "usage: ratedeck config path [--themes] | ratedeck config show [run flags]\n\n"
    "  path   the user config file ($XDG_CONFIG_HOME/ratedeck/config.toml, read when no --config\n"
    "         is given; the console's 's' saves there); --themes: the user themes directory\n"
    "  show   the config in force for these flags, as TOML, keys masked"
)


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return ExitCode.OK if argv else ExitCode.USAGE
    what, rest = argv[0], argv[1:]
    if what == "path":
        if rest not in ([], ["--themes"]):
            return fail(f"config path: unexpected {' '.join(rest)!r} (only --themes)")
        print(user_themes_dir() if rest else user_config_path())
        return ExitCode.OK
    if what == "show":
        parsed = parse_args(run_parser("ratedeck config show"), rest)
        if isinstance(parsed, int):
            return parsed
        try:
            plan = plan_run(parsed)
        except ConfigError as exc:
            return fail(str(exc))
        sys.stdout.write(shown_config(plan.cfg, plan.source))
        return ExitCode.OK
    return fail(f"config: unknown command {what!r}; use 'config path' or 'config show'")


def shown_config(cfg: RunConfig, source: str | None) -> str:
    """The config in force as TOML, for reading: every key masked, where it came from on top."""
    data = to_toml_dict(cfg)
    if "store" in data.get("run", {}):  # a redis:// URL may carry a password
        data["run"]["store"] = safe_url(data["run"]["store"])
    target = data.get("target", {})
    for name in ("url", "proxy", "probe_url"):  # user:password@ in any of them
        if target.get(name):
            target[name] = masked_password(target[name])
    literal = [s for s in cfg.runner.key_sources if not s.strip().startswith(("env:", "@"))]
    if literal and "secrets" in data.get("keys", {}):
        data["keys"]["secrets"] = [
            s if s.strip().startswith(("env:", "@")) else mask_secret(s) for s in cfg.runner.key_sources
        ]
    head = [
        f"# ratedeck {version()}: the config in force",
        f"# from: {'preset ' + cfg.runner.preset + ' + ' if cfg.runner.preset else ''}{source or 'no config file'} + flags",
        f"# user config file: {user_config_path()}",
        "# keys: "
        + (", ".join(f"{k.label} {mask_secret(k.secret)}" for k in cfg.engine_settings.keys) or "none"),
    ]
    text = "\n".join(head) + "\n" + tomli_w.dumps(data)
    return Redactor(k.secret for k in cfg.engine_settings.keys)(text)
