"""The design's shape, checked: no part holds the engine, the engine's surface stays small,
ports are typed, and no code outside `config/` goes by a preset's name.

The layers themselves are the import-linter contracts (`pyproject.toml`), run by
tests/project/test_architecture.py. Each check below reads the source with `ast`;
an exception is listed by name with the reason it stays, and a listed one that no
longer needs listing fails too.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LAYERS = ("core", "engine", "server", "store", "config", "host", "gateway", "console", "bench", "runner")

#: The modules of engine/ that may name the `Engine`: the engine itself, the package's
#: exports, and the library API (`RateDeck` runs an engine: a host, kept in engine/ so
#: `from ratedeck.engine import RateDeck` loads no other layer).
HOLDS_ENGINE = {"engine/engine.py", "engine/__init__.py", "engine/library.py"}

#: The most public names (methods, properties, attributes) `Engine` keeps: its lifecycle,
#: `apply`, `snapshot` and its parts; everything else is a part's (`engine.parts.X`).
MAX_ENGINE_NAMES = 15

#: "Protocol.member" in engine/ports.py typed `Any` -> why no protocol fits.
ANY_IN_PORTS: dict[str, str] = {
    "BudgetWatcher.gave_back": "TODO(issue 40): worker and limiter want the KeyWorker/WindowLimiter ports",
    "BudgetWatcher.synced": "TODO(issue 40): worker and limiter want the KeyWorker/WindowLimiter ports",
    "SharedState.give_back": "a ticket is each store's own, opaque to the engine (memory, SQLite, Redis)",
    "SharedState.sent": "a ticket is each store's own, opaque to the engine (memory, SQLite, Redis)",
    "Grant.tickets": "a ticket is each store's own, opaque to the engine (memory, SQLite, Redis)",
    "MeterHost.workers": "TODO(issue 40): the makespan meter's view of a key wants a port",
    "MeterHost.budgets": "TODO(issue 40): the makespan meter's view of the budgets wants a port",
    "MeterHost.host_limiter": "TODO(issue 40): the makespan meter's view of a limiter wants a port",
}

#: "path" -> why it compares a preset's name outside config/ (a target's abilities are
#: capabilities in its preset, `config/presets/`, never its name in code).
PRESET_NAME_EXCEPTIONS: dict[str, str] = {}


def _sources(*layers: str) -> list[Path]:
    return sorted(p for layer in layers if (REPO / layer).is_dir() for p in (REPO / layer).rglob("*.py"))


def _rel(path: Path) -> str:
    return path.relative_to(REPO).as_posix()


# ---------------------------------------------------------------- no part holds the engine


def names_engine(tree: ast.AST) -> bool:
    """Whether a module imports, annotates or otherwise names the `Engine` class."""
    for node in ast.walk(tree):
        if isinstance(node, ast.alias) and node.name.rsplit(".", 1)[-1] == "Engine":
            return True
        if isinstance(node, ast.Name) and node.id == "Engine":
            return True
        if isinstance(node, ast.Attribute) and node.attr == "Engine":
            return True
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.isidentifier():
            if node.value == "Engine":  # a quoted annotation
                return True
    return False


def test_the_engine_finder_finds_an_import_and_an_annotation():
    assert names_engine(ast.parse("from ratedeck.engine.engine import Engine"))
    assert names_engine(ast.parse("def f(e: 'Engine') -> None: ..."))
    assert names_engine(ast.parse("import x\ndef f(e: x.Engine): ..."))
    assert not names_engine(ast.parse("from .settings import EngineSettings\nx = 'the Engine runs'"))


def test_no_part_of_the_engine_holds_the_engine():
    """The composition root hands each part the ports it uses (engine/ports.py), never the engine."""
    holders = {_rel(p) for p in _sources("engine") if names_engine(ast.parse(p.read_text()))}
    assert holders <= HOLDS_ENGINE, (
        f"parts that name the Engine (take a port instead): {holders - HOLDS_ENGINE}"
    )
    assert not names_engine(ast.parse((REPO / "engine/build.py").read_text())), "build.py builds parts"


# ---------------------------------------------------------------- the engine's surface


def public_names(cls: ast.ClassDef) -> set[str]:
    """A class's public methods and properties, and the public attributes its methods set."""
    names = {
        item.name
        for item in cls.body
        if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef) and not item.name.startswith("_")
    }
    for item in cls.body:
        if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
            names.add(item.target.id)
        if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
            for sub in ast.walk(item):
                targets = sub.targets if isinstance(sub, ast.Assign) else []
                if isinstance(sub, ast.AnnAssign):
                    targets = [sub.target]
                for t in targets:
                    if isinstance(t, ast.Attribute) and getattr(t.value, "id", None) == "self":
                        names.add(t.attr)
    return {n for n in names if not n.startswith("_")}


def _engine_class() -> ast.ClassDef:
    tree = ast.parse((REPO / "engine/engine.py").read_text())
    return next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Engine")


def test_the_surface_counter_counts_methods_properties_and_attributes():
    tree = ast.parse(
        "class A:\n    x: int\n    def __init__(self):\n        self.y = 1\n        self._z = 2\n"
        "    @property\n    def p(self): ...\n    def _q(self): ...\n    async def r(self): ...\n"
    )
    node = tree.body[0]
    assert isinstance(node, ast.ClassDef)
    assert public_names(node) == {"x", "y", "p", "r"}


def test_the_engine_keeps_its_lifecycle_commands_and_snapshot_and_little_else():
    names = public_names(_engine_class())
    assert {"start", "stop", "run", "apply", "snapshot", "parts"} <= names
    assert len(names) <= MAX_ENGINE_NAMES, (
        f"Engine has {len(names)} public names (at most {MAX_ENGINE_NAMES}): {sorted(names)};"
        " callers use the parts (engine.parts.X) or the ports they need"
    )


# ---------------------------------------------------------------- typed ports


def _mentions_any(node: ast.AST | None) -> bool:
    """Whether an annotation uses `Any`, other than as plain data's values (`dict[str, Any]`)."""
    if node is None:
        return False
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        text = re.sub(r"dict\[str, Any\]", "", node.value)
        return re.search(r"\bAny\b", text) is not None
    if isinstance(node, ast.Subscript) and getattr(node.value, "id", None) == "dict":
        args = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        if len(args) == 2 and getattr(args[0], "id", None) == "str" and getattr(args[1], "id", None) == "Any":
            return False
    if isinstance(node, ast.Name | ast.Attribute):
        return getattr(node, "id", getattr(node, "attr", None)) == "Any"
    return any(_mentions_any(child) for child in ast.iter_child_nodes(node))


def any_typed(tree: ast.Module) -> set[str]:
    """ "Class.member" for each member of a class whose annotations use `Any`."""
    found: set[str] = set()
    for cls in tree.body:
        if not isinstance(cls, ast.ClassDef):
            continue
        for item in cls.body:
            if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                if _mentions_any(item.annotation):
                    found.add(f"{cls.name}.{item.target.id}")
            if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                a = item.args
                params = [*a.posonlyargs, *a.args, *a.kwonlyargs, *filter(None, (a.vararg, a.kwarg))]
                if any(_mentions_any(p.annotation) for p in params) or _mentions_any(item.returns):
                    found.add(f"{cls.name}.{item.name}")
    return found


def test_the_any_finder_leaves_plain_data_alone():
    tree = ast.parse(
        "class P:\n    a: Any\n    b: dict[str, Any]\n    def f(self, x: 'Any') -> None: ...\n"
        "    def g(self) -> dict[str, Any]: ...\n    def h(self) -> Sequence[Any]: ...\n"
    )
    assert any_typed(tree) == {"P.a", "P.f", "P.h"}


def test_ports_are_typed_where_a_protocol_fits():
    found = any_typed(ast.parse((REPO / "engine/ports.py").read_text()))
    new = sorted(found - set(ANY_IN_PORTS))
    assert not new, f"ports typed Any (name a protocol, or list them with the reason none fits): {new}"
    stale = sorted(set(ANY_IN_PORTS) - found)
    assert not stale, f"listed as typed Any but no longer are (remove them from ANY_IN_PORTS): {stale}"


# ---------------------------------------------------------------- no preset's name in code


def compares_a_preset(tree: ast.AST) -> list[int]:
    """Lines where a value named like one preset (`preset`, `cfg.runner.preset`) is compared
    (==, !=, in) with a name: a string, a constant (`STUDY`), or a tuple of them."""

    def is_preset(node: ast.expr) -> bool:
        name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""
        return re.fullmatch(r"(\w+_)?preset(_name)?", name.lower()) is not None

    def is_name(node: ast.expr) -> bool:
        if isinstance(node, ast.Constant):
            return isinstance(node.value, str)
        if isinstance(node, ast.Name | ast.Attribute):
            name = node.id if isinstance(node, ast.Name) else node.attr
            return name.isupper() and name != "PRESETS"  # a constant, not the table of presets
        if isinstance(node, ast.Tuple | ast.List | ast.Set):
            return any(is_name(e) for e in node.elts)
        return False

    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            sides = (node.left, *node.comparators)
            ops_ok = all(isinstance(op, ast.Eq | ast.NotEq | ast.In | ast.NotIn) for op in node.ops)
            if ops_ok and any(is_preset(s) for s in sides) and any(is_name(s) for s in sides):
                lines.append(node.lineno)
    return lines


def test_the_preset_finder_finds_a_comparison():
    assert compares_a_preset(ast.parse("if cfg.preset == 'openai': pass")) == [1]
    assert compares_a_preset(ast.parse("x = 'openai' != preset_name")) == [1]
    assert compares_a_preset(ast.parse("ok = preset in ('a', 'b')")) == [1]
    assert compares_a_preset(ast.parse("if cfg.runner.preset not in (None, STUDY): pass")) == [1]
    assert compares_a_preset(ast.parse("if cfg.stream_usage: pass")) == []
    assert compares_a_preset(ast.parse("ok = name in PRESETS")) == []  # the table, not a name


def test_no_code_outside_config_goes_by_a_preset_s_name():
    """What a target can do is a capability in its preset (config/presets/), never its name in code."""
    layers = [layer for layer in LAYERS if layer != "config"]
    found = {
        _rel(p): lines for p in _sources(*layers) if (lines := compares_a_preset(ast.parse(p.read_text())))
    }
    new = {path: lines for path, lines in found.items() if path not in PRESET_NAME_EXCEPTIONS}
    assert not new, f"a preset's name compared outside config/ (give the preset a capability instead): {new}"
