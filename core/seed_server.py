"""Facts about the seed's original server that several layers need.

The seed server accepts exactly these five keys; ratedeck's seed mode accepts
the same strings so that the "seed" preset works unchanged against either.
"""

from __future__ import annotations

SEED_KEYS: tuple[str, ...] = (
    "UT4NHL1J796WCHULA1750MXYF9F5JYA6",
    "8TY2F3KIL38T741G1UCBMCAQ75XU9F5O",
    "954IXKJN28CBDKHSKHURQIVLQHZIEEM9",
    "EUU46ID478HOO7GOXFASKPOZ9P91XGYS",
    "46V5EZ5K2DFAGW85J18L50SGO25WJ5JE",
)
