"""The code stays small enough to hold: no class with behaviour over 25 attributes, no function over 80 lines.

Plain frozen data (snapshots, settings) is exempt from the attribute count. Anything
else over a target is listed below by name with the reason it stays; a new one fails
this test, and so does an exception that no longer needs listing.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LAYERS = ("core", "engine", "server", "store", "config", "host", "gateway", "console", "bench", "runner")
MAX_ATTRIBUTES = 25
MAX_LINES = 80

#: "path:Class" -> why it keeps more than MAX_ATTRIBUTES attributes.
WIDE_EXCEPTIONS: dict[str, str] = {}

#: "path:function" -> why it keeps more than MAX_LINES lines.
LONG_EXCEPTIONS: dict[str, str] = {}


def _sources() -> list[Path]:
    return sorted(p for layer in LAYERS if (REPO / layer).is_dir() for p in (REPO / layer).rglob("*.py"))


def _frozen_data(node: ast.ClassDef) -> bool:
    for deco in node.decorator_list:
        if isinstance(deco, ast.Call) and getattr(deco.func, "id", None) == "dataclass":
            if any(k.arg == "frozen" and getattr(k.value, "value", False) for k in deco.keywords):
                return True
    return False


def attributes(node: ast.ClassDef) -> set[str]:
    """Instance attributes a class sets (`self.x = ...` in its methods) and the ones it declares."""
    names: set[str] = set()
    for item in node.body:
        if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
            names.add(item.target.id)
        if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
            for sub in ast.walk(item):
                targets: list[ast.expr] = []
                if isinstance(sub, ast.Assign):
                    targets = list(sub.targets)
                elif isinstance(sub, ast.AnnAssign | ast.AugAssign):
                    targets = [sub.target]
                for t in targets:
                    for leaf in ast.walk(t):
                        if isinstance(leaf, ast.Attribute) and getattr(leaf.value, "id", None) == "self":
                            names.add(leaf.attr)
    return names


def measure() -> tuple[dict[str, int], dict[str, int]]:
    wide: dict[str, int] = {}
    long: dict[str, int] = {}
    for path in _sources():
        rel = path.relative_to(REPO).as_posix()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and not _frozen_data(node):
                count = len(attributes(node))
                if count > MAX_ATTRIBUTES:
                    wide[f"{rel}:{node.name}"] = count
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > MAX_LINES:
                    long[f"{rel}:{node.name}"] = lines
    return wide, long


def test_the_attribute_counter_counts_what_a_class_sets():
    tree = ast.parse(
        "class A:\n    x: int\n    def __init__(self):\n        self.y = 1\n        self.z: int = 2\n"
        "    def f(self):\n        self.y += 1\n        self.w, self.v = 1, 2\n"
    )
    node = tree.body[0]
    assert isinstance(node, ast.ClassDef)
    assert attributes(node) == {"x", "y", "z", "w", "v"}


def test_no_class_with_behaviour_holds_too_many_attributes():
    wide, _ = measure()
    over = {name: n for name, n in wide.items() if name not in WIDE_EXCEPTIONS}
    assert not over, (
        f"classes over {MAX_ATTRIBUTES} attributes (split them, or list them with a reason): {over}"
    )
    stale = sorted(set(WIDE_EXCEPTIONS) - set(wide))
    assert not stale, f"listed as wide but no longer are: {stale}"


def test_no_function_is_too_long():
    _, long = measure()
    over = {name: n for name, n in long.items() if name not in LONG_EXCEPTIONS}
    assert not over, f"functions over {MAX_LINES} lines (split them, or list them with a reason): {over}"
    stale = sorted(set(LONG_EXCEPTIONS) - set(long))
    assert not stale, f"listed as long but no longer are: {stale}"
