"""The layout holds: layers import downward, no module reaches into another's privates,
the library imports no UI, and the linters and type checker pass."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LAYERS = ("core", "engine", "server", "store", "config", "host", "runner", "bench", "console")
BIN = Path(sys.executable).parent


def _tool(name: str) -> str:
    path = BIN / name
    if path.exists():
        return str(path)
    found = shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is not installed: pip install -e '.[test]'")
    return found


def test_the_library_api_loads_no_ui_package():
    code = (
        "import sys, ratedeck.engine\n"
        "from ratedeck.engine import RateDeck\n"
        "from ratedeck.config import load_config\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'textual', 'plotext', 'rich'}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"


def test_a_run_on_pyreqwest_never_loads_aiohttp():
    """Loading aiohttp costs a start about 0.1 s of CPU (it builds TLS contexts): a headless
    run on the default client, with no probe and no proxy, has no use for it. The run is
    real: the CLI against a closed port, its failures named by pyreqwest's reader."""
    code = (
        "import atexit, sys\n"
        "atexit.register(lambda: print('LOADED', sorted({m.split('.')[0] for m in sys.modules} & {'aiohttp'})))\n"
        "from ratedeck.runner.cli import main\n"
        "sys.argv = ['ratedeck', '--no-ui', '--target', 'http://127.0.0.1:9/api', '--keys', 'k-1234567890',"
        " '--limit', '5/1s', '--duration', '1']\n"
        "main()\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert "connection refused" in out.stdout + out.stderr
    assert "LOADED []" in out.stdout


def test_the_library_exports_what_it_documents():
    import ratedeck.engine as api

    assert "RateDeck" in api.__all__ and all(hasattr(api, name) for name in api.__all__)
    assert (REPO / "engine" / "py.typed").is_file()


_PUBLIC_UNDERSCORED = {"os._exit"}  # documented API whose name starts with _


def private_reaches(tree: ast.AST) -> list[tuple[int, str]]:
    """`other._name` where `other` is not self, cls or super(): a reach into someone's privates."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        name = node.attr
        if not name.startswith("_") or (name.startswith("__") and name.endswith("__")):
            continue
        owner = node.value
        if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
            continue
        if isinstance(owner, ast.Call) and isinstance(owner.func, ast.Name) and owner.func.id == "super":
            continue
        if isinstance(owner, ast.Name) and f"{owner.id}.{name}" in _PUBLIC_UNDERSCORED:
            continue
        found.append((node.lineno, ast.unparse(node)))
    return found


def test_private_reach_finder_finds_a_reach():
    assert private_reaches(ast.parse("engine._check_finished()\nself._ok\n")) == [
        (1, "engine._check_finished")
    ]


def test_no_module_reaches_into_another_s_private_names():
    reaches = []
    for layer in LAYERS:
        for path in sorted((REPO / layer).rglob("*.py")):
            for line, text in private_reaches(ast.parse(path.read_text(encoding="utf-8"))):
                reaches.append(f"{path.relative_to(REPO)}:{line}: {text}")
    assert reaches == []


def test_import_contracts_hold():
    proc = subprocess.run([_tool("lint-imports")], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]


def test_ruff_lint_and_format_are_clean():
    ruff = _tool("ruff")
    lint = subprocess.run([ruff, "check", "."], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert lint.returncode == 0, lint.stdout[-3000:]
    fmt = subprocess.run(
        [ruff, "format", "--check", "."], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert fmt.returncode == 0, fmt.stdout[-3000:]


@pytest.mark.slow
def test_every_layer_type_checks():
    """.ci/typecheck runs mypy over the whole `ratedeck` namespace: every layer, console and runner too."""
    script = (REPO / ".ci" / "typecheck").read_text()
    assert "-p ratedeck\n" in script and all(
        f"{layer}" in script for layer in ("core engine server store config host runner bench console",)
    )
    proc = subprocess.run(
        ["bash", str(REPO / ".ci" / "typecheck")],
        capture_output=True,
        text=True,
        timeout=300,
        env={"PYTHON": sys.executable, "PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]


def test_a_request_s_walk_enters_the_engine_module_once_at_its_end():
    """From its launch a request's path runs in engine/path/request_path.py (and what it calls:
    the key's sender loop and limits, the verdict) and leaves it only to hand the request's end
    to the run's end (`RunEnd.finish`, engine/path/ending.py), once per request; it never calls
    into engine/engine.py, which keeps the lifecycle. Calls made from the request path's modules
    are counted while a run sends."""
    from ratedeck.server.simulated import run_virtual
    from tests.support.engine_helpers import seed_engine

    engine, _ = seed_engine(workload={"total": 60}, engine={"graveyard_path": ""})
    path_files = {
        str(REPO / "engine" / "path" / name)
        for name in ("request_path.py", "worker.py", "key.py", "settle.py")
    }
    watched = {
        str(REPO / "engine" / "engine.py"): "engine",
        str(REPO / "engine" / "path" / "ending.py"): "end",
    }
    entries: dict[str, int] = {}

    def profile(frame, event, _arg):
        if event != "call" or frame.f_code.co_filename not in watched:
            return
        caller = frame.f_back
        if caller is not None and caller.f_code.co_filename in path_files:
            name = f"{watched[frame.f_code.co_filename]}.{frame.f_code.co_name}"
            entries[name] = entries.get(name, 0) + 1

    sys.setprofile(profile)
    try:
        snap = run_virtual(engine.run(30))
    finally:
        sys.setprofile(None)
    assert snap.succeeded == 60 and snap.sent >= 60
    assert entries == {"end.finish": 60}, entries


def _readme_path_modules() -> list[str]:
    """The modules and folders the README's numbered request path names, in its order (a module
    named at two steps, as the key worker is, twice; a name repeated within a step once)."""
    import re

    readme = (REPO / "README.md").read_text()
    steps = readme[readme.index("A request's path, one direction") :]
    steps = steps[: steps.index("\n\n", steps.index("\n1. "))]
    names: list[str] = []
    for step in re.split(r"\n\d\. ", steps):
        names += [
            n for n in dict.fromkeys(re.findall(r"`(engine/[a-z_/]+(?:\.py)?)`", step)) if n not in names[-1:]
        ]
    return names


def test_a_request_s_walk_follows_the_readme_s_path_entering_each_module_once():
    """One request, from the workload that made it to its end: every module it is handed to
    (a call from another module with the request in hand; a task's steps run by the loop are
    not hand-offs) is one the README's request path names, in the README's order, each step
    entered once (the key worker at its steps: it takes the request, then as the path's
    `KeySide` it learns from the answer and carries out the verdict's key part)."""
    from ratedeck.engine.request import Request
    from ratedeck.server.simulated import run_virtual
    from tests.support.engine_helpers import seed_engine

    order = _readme_path_modules()
    assert order[0] == "engine/sources/" and order[-1] == "engine/path/ending.py", order

    def place(path: str, after: int) -> int | None:
        """The first of the README's steps at or after `after` that names `path`."""
        hits = [
            i
            for i, name in enumerate(order)
            if i >= after and (path == name or (name.endswith("/") and path.startswith(name)))
        ]
        return hits[0] if hits else None

    engine, _ = seed_engine(workload={"total": 1}, engine={"graveyard_path": ""})
    loop_files = {"events.py", "tasks.py", "base_events.py"}
    entries: list[tuple[str, str]] = []
    calls: list[str] = []  # each entry's module and function

    def profile(frame, event, _arg):
        if event != "call" or frame.f_back is None:
            return
        callee, caller = frame.f_code.co_filename, frame.f_back.f_code.co_filename
        if callee == caller or Path(caller).name in loop_files or not callee.startswith(str(REPO / "engine")):
            return
        if callee.endswith("engine/request.py") or not any(
            isinstance(v, Request) for v in frame.f_locals.values()
        ):
            return
        entries.append((Path(caller).relative_to(REPO).as_posix(), Path(callee).relative_to(REPO).as_posix()))
        calls.append(f"{Path(callee).relative_to(REPO).as_posix()}:{frame.f_code.co_name}")

    sys.setprofile(profile)
    try:
        snap = run_virtual(engine.run(30))
    finally:
        sys.setprofile(None)
    assert snap.succeeded == 1
    entered = [callee for _caller, callee in entries]
    assert len(calls) == len(set(calls)), f"a step entered twice: {calls}"
    assert entries[0][0].startswith("engine/sources/"), entries  # the source hands it in
    at = 0
    for module in entered:
        found = place(module, at)
        assert found is not None, (
            f"entered {module} out of the README's order {order} (or not named): {entries}"
        )
        at = found
    assert (
        calls.count("engine/path/worker.py:answered") == calls.count("engine/path/worker.py:carry_out") == 1
    ), calls
    assert {
        "engine/path/intake.py",
        "engine/queues.py",
        "engine/path/request_path.py",
        "engine/path/key.py",
    } <= set(entered) and entered[-1] == "engine/path/ending.py", entries
