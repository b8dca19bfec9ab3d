"""Dependencies as declared (issue 23): every third-party module ratedeck imports is declared in
pyproject.toml (a dependency, or an extra for the parts that need one), and the Redis store
says how to install its extra when it is missing."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LAYERS = (
    "core",
    "engine",
    "server",
    "host",
    "config",
    "store",
    "gateway",
    "console",
    "bench",
    "runner",
    "themes",
)
# Import name -> distribution name, where they differ.
DISTRIBUTION = {
    "tomli_w": "tomli-w",
    "prometheus_client": "prometheus-client",
    "pyrate_limiter": "pyrate-limiter",
}
# Imported only by the parts an extra installs (checked against that extra).
EXTRA = {
    "redis": "redis",
    "aiolimiter": "bench",
    "pyrate_limiter": "bench",
    "openai": "bench",
    "anthropic": "bench",
}


def _imported() -> set[str]:
    names: set[str] = set()
    for layer in LAYERS:
        for path in (ROOT / layer).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Import):
                    names |= {a.name.split(".")[0] for a in node.names}
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names.add(node.module.split(".")[0])
    return {n for n in names if n not in sys.stdlib_module_names and n not in ("ratedeck", "__future__")}


def _names(requirements: list[str]) -> set[str]:
    return {re.split(r"[\s\[<>=!~;]", r, maxsplit=1)[0].lower() for r in requirements}


def test_every_imported_package_is_declared():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = _names(project["dependencies"])
    extras = {name: _names(reqs) for name, reqs in project["optional-dependencies"].items()}
    imported = _imported()
    assert {"aiohttp", "yarl", "multidict", "textual", "rich"} <= imported  # the scan sees them
    for module in sorted(imported):
        dist = DISTRIBUTION.get(module, module).lower()
        where = extras[EXTRA[module]] if module in EXTRA else declared
        assert dist in where, f"{module} is imported but {dist} is not declared"
    assert "httptools" not in declared | set().union(*extras.values())  # nothing uses it now


def test_the_redis_store_without_its_package_says_how_to_install_it(monkeypatch):
    import importlib.util

    from ratedeck.store.base import StoreError
    from ratedeck.store.open import open_store

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "redis" else real(name, *a)
    )
    with pytest.raises(StoreError) as caught:
        open_store("redis://127.0.0.1:6379/0")
    assert str(caught.value) == "needs the redis package: pip install 'ratedeck[redis]'"
