"""The entry throttle's one parser: "off", "auto" or messages per second."""

from __future__ import annotations

import math
from typing import Literal

ThrottleMode = Literal["off", "auto", "fixed"]
MAX_THROTTLE = 1_000_000.0


def parse_throttle(value: object) -> tuple[ThrottleMode, float]:
    """("off"|"auto"|"fixed", messages/s) from "off", "auto", 25, "25", "25/s" or "12.5 msg/s".

    Raises `ValueError` with a message fit to show a user for anything else.
    """
    if isinstance(value, str):
        text = value.strip().lower()
        if text in ("off", "auto"):
            return text, 0.0  # type: ignore[return-value]
        for suffix in ("msg/s", "/s"):
            text = text.removesuffix(suffix).strip()
        if not text:
            raise ValueError('type a throttle in messages per second, e.g. 25 (or "off", "auto")')
        try:
            number = float(text)
        except ValueError:
            raise ValueError(
                f'throttle must be "off", "auto" or messages per second, got {value.strip()!r}'
            ) from None
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        number = float(value)
    else:
        raise ValueError(f'throttle must be "off", "auto" or messages per second, got {value!r}')
    if not math.isfinite(number) or number <= 0:
        raise ValueError(f"a fixed throttle must be above 0 messages/s, got {value!r}")
    if number > MAX_THROTTLE:
        raise ValueError(f"a throttle of {number:g} messages/s is more than the {MAX_THROTTLE:g} allowed")
    return "fixed", number
