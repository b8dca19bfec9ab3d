"""ratedeck's settings: one schema, one row per setting (`rows.py`), and everything made from it.

    from ratedeck.config import load_config

From the rows come the run command's flags (`flags.py`), loading a TOML file
with presets and flags over it (`load.py`), saving (`save.py`), `ratedeck config
show`, and the reference and JSON schema under docs/ (`python -m
ratedeck.config.docs --write`). Presets are data files in `presets/`.

Where the layer sits: just below the host, above the engine, the simulator and
the store (runner > console|bench > host > config > server|store > engine >
core). The host hands a run's settings to child processes and reports the
settings in force (`to_toml_dict`); with the config layer below it, the host
uses the serialiser and the combined `RunConfig` directly, with nothing passed
down through it. The engine never imports this layer (an import-linter
contract): it receives `EngineSettings`, frozen dataclasses with enums, and
does no I/O for settings; key files and environment variables are read here.
The store reads its two settings (`store`, `resume`) through a protocol of its
own.
"""

from ratedeck.engine.settings import ConfigError, EngineSettings

from .load import PRESET_DESCRIPTIONS, PRESETS, build_config, load_config, parse_setting, read_toml
from .parsers import header_line, resolve_secrets
from .save import to_toml_dict
from .settings import ConsoleSettings, RunConfig, RunnerSettings, with_graveyard_place

__all__ = [
    "PRESETS",
    "PRESET_DESCRIPTIONS",
    "ConfigError",
    "ConsoleSettings",
    "EngineSettings",
    "RunConfig",
    "RunnerSettings",
    "build_config",
    "header_line",
    "load_config",
    "parse_setting",
    "read_toml",
    "resolve_secrets",
    "to_toml_dict",
    "with_graveyard_place",
]
