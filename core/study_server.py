"""Facts about the study's server that several layers need.

The study ratedeck grew from describes a server with exactly these five keys,
20/1s each, 0..50 ms each way, a nonce, and a block after 10 rejections. ratedeck's simulator in `study` mode
accepts the same strings, so the "study" preset works unchanged against either.

"seed" is an old name for the preset and the mode: it works as an alias that
says it is one (`current_name`), and "seed" otherwise means a random seed.
"""

from __future__ import annotations

import sys
from typing import Literal, TypeVar, cast

STUDY_KEYS: tuple[str, ...] = (
    "UT4NHL1J796WCHULA1750MXYF9F5JYA6",
    "8TY2F3KIL38T741G1UCBMCAQ75XU9F5O",
    "954IXKJN28CBDKHSKHURQIVLQHZIEEM9",
    "EUU46ID478HOO7GOXFASKPOZ9P91XGYS",
    "46V5EZ5K2DFAGW85J18L50SGO25WJ5JE",
)

T = TypeVar("T")

#: The name of the study's preset and of the simulator's mode that behaves like its server.
STUDY = "study"

#: Old names that still work: kind -> old name -> the name it stands for.
OLD_NAMES: dict[str, dict[str, str]] = {
    "preset": {"seed": STUDY},
    "mode": {"seed": STUDY},
}


def current_name(kind: Literal["preset", "mode"], name: T) -> T:
    """`name` (a preset or a simulator mode), with an old name replaced by the one it
    stands for; an old name prints one line on stderr saying so. Anything else
    (unknown names, non-strings) comes back as it was, for the caller to judge."""
    if not isinstance(name, str):
        return name
    new = OLD_NAMES[kind].get(name)
    if new is None:
        return name
    print(f'{kind} "{name}" is an old name for "{new}"', file=sys.stderr)
    return cast(T, new)
