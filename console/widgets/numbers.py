"""How the console writes numbers: compact, fixed-width-friendly, never noisy."""

from __future__ import annotations

from ratedeck.engine.snapshot import LatencySummary


def count(value: int | float) -> str:
    """A count with thin grouping ("12 345"); millions shortened ("3.2M")."""
    value = int(value)
    if abs(value) >= 10_000_000:
        return f"{value / 1_000_000:.1f}M"
    return f"{value:,}".replace(",", " ")


def rate(value: float) -> str:
    """Requests per second: one decimal below 100, whole numbers above."""
    return f"{value:.1f}" if value < 100 else f"{value:,.0f}".replace(",", " ")


def millis(value: float | None) -> str:
    """Milliseconds, or an em dash when there is no measurement yet."""
    if value is None:
        return "—"
    return f"{value:.1f} ms" if value < 100 else f"{value:.0f} ms"


def percentile(summary: LatencySummary, value: float) -> str:
    """A percentile of `summary` in milliseconds, or an em dash before anything was measured."""
    return millis(value if summary.count else None)


def duration(seconds: float) -> str:
    """Elapsed time as 1h02m03s / 2m03s / 3.0s."""
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.1f}s"
    whole = int(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m{secs:02d}s" if hours else f"{minutes}m{secs:02d}s"


def share(part: int, whole: int) -> str:
    """`part` as a percentage of `whole`; tiny non-zero shares say "<0.1%"."""
    if whole <= 0 or part <= 0:
        return "0%"
    pct = 100 * part / whole
    return "<0.1%" if pct < 0.1 else f"{pct:.1f}%"


def compact_count(value: int | float) -> str:
    """A count in at most 7 characters, for table cells: "999 999", "1.23M", "12.3M"."""
    value = int(value)
    if abs(value) < 1_000_000:
        return f"{value:,}".replace(",", " ")
    if abs(value) < 100_000_000:
        return f"{value / 1_000_000:.3g}M"
    return f"{value / 1_000_000_000:.3g}G"
