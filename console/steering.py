"""Controls that build on each other even when the engine has not caught up.

A command reaches the engine at once, but the snapshot that shows its effect
can come a refresh or two later. Quick repeated presses must build on what
was just sent, not on a stale snapshot, or presses are lost. `Pending` holds
each value sent until a snapshot shows it (or `hold_s` passes, in case the
engine settled on something else). `RateSteps` makes arrival-rate steps
multiplicative and exactly reversible.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

HOLD_S = 2.0


def same(a: Any, b: Any) -> bool:
    """Equal, with floats compared to a relative 1e-9."""
    if isinstance(a, float) or isinstance(b, float):
        try:
            return math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=1e-9)
        except (TypeError, ValueError):
            return False
    return a == b


class Pending:
    """Values sent to the engine that a snapshot may not show yet, by name."""

    def __init__(self, hold_s: float = HOLD_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.hold_s = hold_s
        self.clock = clock
        self._values: dict[str, tuple[Any, float]] = {}

    def set(self, name: str, value: Any) -> None:
        self._values[name] = (value, self.clock())

    def clear(self, name: str) -> None:
        self._values.pop(name, None)

    def get(self, name: str, truth: Any, match: Callable[[Any, Any], bool] = same) -> Any:
        """The value sent under `name` until `truth` (the snapshot's) matches it or it is too old."""
        held = self._values.get(name)
        if held is None:
            return truth
        value, at = held
        if match(value, truth) or self.clock() - at > self.hold_s:
            del self._values[name]
            return truth
        return value


class RateSteps:
    """Arrival-rate steps: up multiplies by `factor`, down divides by it.

    Rates are computed from the rate where the stepping began (`anchor`) and
    a whole number of steps, never from a rounded previous value, so n steps
    up and n down return exactly to the start. Stepping begins again from the
    current rate when it is not the last one sent (someone else changed it).
    """

    def __init__(self, factor: float = 1.1) -> None:
        self.factor = factor
        self.anchor: float | None = None
        self.steps = 0
        self.last: float | None = None

    def step(self, current: float, direction: int) -> float:
        if self.anchor is None or self.last is None or not same(current, self.last):
            self.anchor, self.steps = current, 0
        if self.anchor <= 0:
            # From zero a percentage goes nowhere; up starts at 1/s.
            if direction > 0:
                self.anchor, self.steps = 1.0, 0
                self.last = 1.0
                return 1.0
            self.last = 0.0
            return 0.0
        self.steps += direction
        rate = self.anchor if self.steps == 0 else round(self.anchor * self.factor**self.steps, 6)
        self.last = rate
        return rate
