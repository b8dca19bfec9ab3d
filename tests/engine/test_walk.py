"""One request's walk from its source to its end, read as the README's request path says it:
each step hands the next one value (the request, a `Send` plan, the `Outcome`, what the key
knows, the `Verdict`, the `Ending`), and no step calls back up the path.

The walk is recorded with `sys.setprofile` on a virtual-time run of the study preset: every
call from one module of the tree into another with the request in hand (in its arguments or
its return), with the values it takes and returns. A task's steps run by the loop are not
hand-offs. With `[pools]` the decision to send depends on the request, so `admit` runs for it.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path
from typing import get_type_hints

import pytest

from ratedeck.core.vocab import Ending
from ratedeck.engine.http.outcome import Outcome
from ratedeck.engine.path.admit import Send
from ratedeck.engine.path.settle import Verdict
from ratedeck.engine.ports import KeySide
from ratedeck.engine.request import Request
from ratedeck.server.simulated import run_virtual
from tests.support.engine_helpers import seed_engine

REPO = Path(__file__).resolve().parents[2]
_LOOP_FILES = {"events.py", "tasks.py", "base_events.py"}
#: The values a step may hand on, by the name the walk shows.
_VALUES = {Request: "request", Send: "Send", Outcome: "Outcome", Verdict: "Verdict", Ending: "Ending"}


def _name(value: object) -> str | None:
    for kind, name in _VALUES.items():
        if isinstance(value, kind):
            return name
    if isinstance(value, tuple) and value:
        names = [_name(v) for v in value]
        if any(names):  # a pair the queue hands back: (request, Send)
            return "(" + ", ".join(n for n in names if n) + ")"
        if isinstance(value[0], str) and all(isinstance(v, bool) for v in value[1:-1]):
            return "facts"  # KeySide.answered: label, refused, explains, cool-off
    return None


def _rel(path: str) -> str:
    return Path(path).relative_to(REPO).as_posix()


def _trace(pools: bool, total: int, follow: bool):
    """Run `total` requests. `follow`: the steps of the request, as (caller, callee, function,
    values handed in, value handed back); else every call between two of the engine's modules."""
    kw = {"pools": {"read": 2}} if pools else {}
    engine, _ = seed_engine(workload={"total": total}, engine={"graveyard_path": ""}, **kw)
    root = str(REPO)
    steps: list[list] = []
    open_steps: dict[int, tuple[object, list]] = {}  # by frame (kept: a resumed coroutine is one step)
    calls: set[tuple[str, str, str]] = set()

    def profile(frame, event, arg):
        if event not in ("call", "return") or frame.f_back is None:
            return
        callee, caller = frame.f_code.co_filename, frame.f_back.f_code.co_filename
        if callee == caller or Path(caller).name in _LOOP_FILES or not callee.startswith(root):
            return
        if not caller.startswith(root) or callee.endswith("engine/request.py"):
            return
        if not follow:
            if event == "call" and "/engine/" in callee and "/engine/" in caller:
                calls.add((_rel(caller), _rel(callee), frame.f_code.co_name))
            return
        opened = open_steps.get(id(frame))
        if event == "call":
            handed = [_name(v) for v in frame.f_locals.values()]
            if "request" in handed and (opened is None or opened[0] is not frame):
                step = [_rel(caller), _rel(callee), frame.f_code.co_name, tuple(n for n in handed if n), None]
                open_steps[id(frame)] = (frame, step)
                steps.append(step)
            return
        back = _name(arg)
        if opened is not None and opened[0] is frame:
            opened[1][4] = back  # a coroutine returns at each suspension: its last return is its value
        elif back is not None and "request" in back:  # the queue hands the request back up
            steps.append([_rel(caller), _rel(callee), frame.f_code.co_name, (), back])

    sys.setprofile(profile)
    try:
        snap = run_virtual(engine.run(30))
    finally:
        sys.setprofile(None)
    assert snap.succeeded == total
    return [tuple(s) for s in steps], calls


#: The README's request path for a request that spends as every request does: the key's one plan.
_ALIKE = [
    ("engine/sources/workload.py", "engine/path/intake.py", "new_request", (), "request"),
    ("engine/sources/workload.py", "engine/path/intake.py", "submit", ("request",), None),
    ("engine/path/intake.py", "engine/queues.py", "put", ("request",), None),
    ("engine/path/worker.py", "engine/queues.py", "pop_ready", (), "request"),
    ("engine/path/worker.py", "engine/path/request_path.py", "launch", ("request",), None),
    ("engine/path/request_path.py", "server/simulated.py", "send", ("request",), "Outcome"),
    ("engine/path/request_path.py", "engine/path/worker.py", "answered", ("Outcome", "request"), "facts"),
    ("engine/path/worker.py", "engine/path/key.py", "learn", ("Outcome", "request"), None),
    ("engine/path/request_path.py", "engine/observe/spend.py", "answered", ("request", "Outcome"), None),
    ("engine/path/request_path.py", "engine/path/settle.py", "decide", ("Outcome", "request"), "Verdict"),
    (
        "engine/path/request_path.py",
        "engine/path/worker.py",
        "carry_out",
        ("Verdict", "request", "Outcome"),
        None,
    ),
    ("engine/path/request_path.py", "engine/path/ending.py", "finish", ("request", "Ending"), None),
]

#: With connection pools the decision depends on the request: the worker's look asks `admit`
#: for each request the queue offers (`WorkQueues.pick`), and the queue hands back the one sent.
_PER_REQUEST = [
    *_ALIKE[:3],
    ("engine/queues.py", "engine/path/worker.py", "choose", ("request",), "Send"),
    ("engine/path/worker.py", "engine/path/admit.py", "admit", ("request",), "Send"),
    ("engine/path/worker.py", "engine/queues.py", "pick", (), "(request, Send)"),
    *_ALIKE[4:],
]


@pytest.mark.parametrize("pools, walk", [(False, _ALIKE), (True, _PER_REQUEST)], ids=["alike", "admit"])
def test_one_request_s_walk_hands_on_one_value_per_step(pools, walk):
    steps, _ = _trace(pools, 1, follow=True)
    assert steps == walk


# The calls that go back up the path, each a port named here: the path tells the key (below it
# in the README: `ports.KeySide`); `admit` reads the connection pools' room (`WorkerHost.pool_ok`).
_UP_ALLOWED = {
    ("engine/path/request_path.py", "engine/path/worker.py", "answered"),
    ("engine/path/request_path.py", "engine/path/worker.py", "carry_out"),
    ("engine/path/request_path.py", "engine/path/worker.py", "wake_if_sooner"),
    ("engine/path/admit.py", "engine/path/request_path.py", "_pool_has_room"),
}
#: From the worker on, in the README's order (the queues are where the worker pulls work from
#: and a retry goes back to: not a step that decides).
_PATH = ["engine/path/worker.py", "engine/path/admit.py", "engine/path/request_path.py"]
_PATH += ["engine/path/key.py", "engine/path/settle.py", "engine/path/ending.py"]


@pytest.mark.parametrize("pools", [False, True], ids=["alike", "admit"])
def test_no_step_calls_back_up_the_path(pools):
    """Among the request path's modules a call goes down the README's order, but for the ports
    named in `_UP_ALLOWED`; the worker enters the path only to launch, the key side and the two
    decisions (`admit`, `settle.decide`) call nothing above them."""
    _, calls = _trace(pools, 60, follow=False)
    up = {
        (a, b, f)
        for a, b, f in calls
        if a in _PATH and b in _PATH and _PATH.index(b) < _PATH.index(a) and (a, b, f) not in _UP_ALLOWED
    }
    assert up == set()
    into_path = {f for a, b, f in calls if b == "engine/path/request_path.py" and a in _PATH}
    assert into_path <= {"launch", "expire", "shed", "_pool_has_room"}, into_path
    assert ("engine/path/worker.py", "engine/path/request_path.py", "launch") in calls
    from_key_side = {(a, b) for a, b, _f in calls if a in ("engine/path/key.py", "engine/path/settle.py")}
    assert {b for _a, b in from_key_side} & {"engine/path/worker.py", "engine/path/request_path.py"} == set()


def test_the_path_reaches_its_key_only_through_the_key_side_port():
    """What `RequestPath` reads or calls of the key that sent an attempt is `ports.KeySide`, and
    nothing more: not its limits, counts or gates (request_path.py imports no worker)."""
    source = (REPO / "engine" / "path" / "request_path.py").read_text()
    tree = ast.parse(source)
    used = {
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "key"
    }
    port = {name for name in vars(KeySide) if not name.startswith("_")} | set(get_type_hints(KeySide))
    assert used and used <= port, used - port
    assert "worker" not in source.split('"""', 2)[2].split("class RequestPath")[0]  # no import of it
