"""Time charts an operator can read: a y-axis with values, a time axis, fixed scales.

Two kinds, both drawn in text cells with theme colours:

- `bars`: one column per time slice, eighth-block bars from a zero baseline,
  with horizontal reference lines (capacity) drawn across. The scale runs
  from 0 to a round number above the largest of data and lines, so a full
  bar means "at capacity", never "at the largest value seen".
- `log`: braille lines (2x4 dots per cell) on a log10 scale spanning whole
  decades, so 52.2 ms and 52.6 ms look the same and 50 ms vs 500 ms look a
  decade apart.

The rendering functions are pure (rows of `(text, style)` runs) and tested on
their own; `Chart` resamples its data to its width and caches the result
until the data or its size changes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from textual.content import Content
from textual.widget import Widget

from ..history import resample

Run = tuple[str, str]  # (text, style)
Row = list[Run]

BLOCKS = " ▁▂▃▄▅▆▇█"
GRID_STYLE = "$foreground 18%"
AXIS_STYLE = "$text-muted"
_NICE = (1.0, 1.2, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0)
# braille dot bits: [x][y] with y = 0 at the top of the cell
_BRAILLE = ((0x01, 0x02, 0x04, 0x40), (0x08, 0x10, 0x20, 0x80))


def nice_top(value: float) -> float:
    """The smallest round number (1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8 × 10^k) >= value."""
    if value <= 0 or not math.isfinite(value):
        return 1.0
    scale = 10 ** math.floor(math.log10(value))
    for step in _NICE:
        if step * scale >= value * (1 - 1e-9):
            return step * scale
    return 10 * scale


def short_number(value: float) -> str:
    """An axis label: 0, 7.5, 120, 1.5k, 20k, 1.2M."""
    if value >= 1_000_000:
        return f"{value / 1_000_000:.3g}M"
    if value >= 1000:
        return f"{value / 1000:.3g}k"
    if value >= 10 or value == int(value):
        return f"{value:.0f}"
    return f"{value:.2g}"


def short_millis(value_ms: float) -> str:
    """A latency axis label: 1 ms, 10 ms, 100 ms, 1 s, 10 s."""
    if value_ms >= 1000:
        return f"{value_ms / 1000:g} s"
    if value_ms >= 1:
        return f"{value_ms:g} ms"
    return f"{value_ms * 1000:g} µs"


def time_ago(seconds: float) -> str:
    """A time-axis label: -45s, -5m, -2m30s, -1h05m."""
    seconds = round(seconds)
    if seconds <= 0:
        return "now"
    if seconds < 60:
        return f"-{seconds}s"
    minutes, secs = divmod(seconds, 60)
    if minutes < 60:
        return f"-{minutes}m{secs:02d}s" if secs else f"-{minutes}m"
    hours, minutes = divmod(minutes, 60)
    return f"-{hours}h{minutes:02d}m"


def log_range(values: Sequence[float | None], floor_decades: int = 2) -> tuple[int, int]:
    """Whole decades (log10) spanning the positive values, at least `floor_decades` wide."""
    positive = [value for value in values if value is not None and value > 0]
    if not positive:
        return 1, 1 + floor_decades  # 10 ms .. 1 s before any data
    lo = math.floor(math.log10(min(positive)))
    hi = math.ceil(math.log10(max(positive)) + 1e-9)
    while hi - lo < floor_decades:
        # grow towards the side with more room for change: upwards first
        if hi - math.log10(max(positive)) <= math.log10(min(positive)) - lo:
            hi += 1
        else:
            lo -= 1
    return lo, hi


def _merge(runs: Row) -> Row:
    merged: Row = []
    for text, style in runs:
        if merged and merged[-1][1] == style:
            merged[-1] = (merged[-1][0] + text, style)
        else:
            merged.append((text, style))
    return merged


def bar_rows(
    values: Sequence[float | None],
    top: float,
    rows: int,
    style: str,
    lines: Sequence[tuple[Sequence[float | None], str, str]] = (),
    grid: Sequence[int] = (),
) -> list[Row]:
    """Plot rows (top first) of eighth-block bars from zero up to `top`.

    `lines` are (value per column, character, style): a reference line drawn
    in every cell the bar does not fill. `grid` rows get a faint dotted line
    where nothing else is drawn.
    """
    columns = len(values)
    cells: list[list[Run]] = [[(" ", "")] * columns for _ in range(rows)]
    heights = []
    for value in values:
        if value is None or value <= 0 or top <= 0:
            heights.append(0)
            continue
        eighths = round(min(value, top) / top * rows * 8)
        heights.append(max(eighths, 1))  # any success shows
    for row in grid:
        if 0 <= row < rows:
            cells[row] = [("┈", GRID_STYLE)] * columns
    for line_values, char, line_style in lines:
        for column, value in enumerate(line_values):
            if value is None or top <= 0 or value < 0:
                continue
            level = min(value, top) / top * rows  # in rows from the bottom
            row = rows - 1 - min(rows - 1, int(level - 1e-9)) if level > 0 else rows - 1
            cells[row][column] = (char, line_style)
    line_styles = {line_style for _, _, line_style in lines}
    for column, height in enumerate(heights):
        for row in range(rows):
            fill = height - (rows - 1 - row) * 8
            char, cell_style = cells[row][column]
            if cell_style in line_styles:
                # The line stays visible: across a bar that fills at least half
                # the cell it is drawn on the bar's colour.
                if fill >= 4:
                    cells[row][column] = (char, f"{cell_style} on {style}")
            elif fill >= 8:
                cells[row][column] = ("█", style)
            elif fill > 0:
                cells[row][column] = (BLOCKS[fill], style)
    return [_merge(row) for row in cells]


def log_rows(
    series: Sequence[tuple[Sequence[float | None], str]],
    lo: int,
    hi: int,
    rows: int,
    columns: int,
    grid: Sequence[int] = (),
) -> list[Row]:
    """Plot rows of braille lines on a log10 scale from 10^lo to 10^hi.

    Each series has two values per cell (left and right dot column); later
    series are drawn over earlier ones where they share a cell.
    """
    dots_y = rows * 4
    bits = [[0] * columns for _ in range(rows)]
    owner: list[list[str]] = [[""] * columns for _ in range(rows)]

    def level(value: float) -> int:
        fraction = (math.log10(value) - lo) / (hi - lo)
        return min(dots_y - 1, max(0, round(fraction * (dots_y - 1))))

    for values, style in series:
        previous: int | None = None
        for x, value in enumerate(values[: columns * 2]):
            if value is None or value <= 0:
                previous = None
                continue
            y = level(value)
            low, high = (y, y) if previous is None else (min(y, previous), max(y, previous))
            for dot in range(low, high + 1):
                row, sub = divmod(dots_y - 1 - dot, 4)
                bits[row][x // 2] |= _BRAILLE[x % 2][sub]
                owner[row][x // 2] = style
            previous = y
    grid_rows = set(grid)
    out: list[Row] = []
    for row in range(rows):
        runs: Row = []
        for column in range(columns):
            if bits[row][column]:
                runs.append((chr(0x2800 + bits[row][column]), owner[row][column]))
            elif row in grid_rows:
                runs.append(("┈", GRID_STYLE))
            else:
                runs.append((" ", ""))
        out.append(_merge(runs))
    return out


def time_axis(columns: int, span_s: float) -> str:
    """The x axis under the plot: "└-1m──────-30s──────now"."""
    if columns <= 0:
        return "└"
    chars = ["─"] * columns
    labels = [(0, time_ago(span_s), "left")]
    if columns >= 24:
        labels.append((columns // 2, time_ago(span_s / 2), "centre"))
    labels.append((columns, "now", "right"))
    for position, text, align in labels:
        start = (
            position
            if align == "left"
            else position - len(text)
            if align == "right"
            else position - len(text) // 2
        )
        start = max(0, min(columns - len(text), start))
        if len(text) <= columns:
            chars[start : start + len(text)] = list(text)
    return "└" + "".join(chars)


@dataclass(frozen=True)
class Series:
    """Values oldest first, each covering `res_s` seconds, the last ending now."""

    values: tuple[float | None, ...]
    style: str
    how: str = "mean"  # how to fold several values into one column: "mean" or "max"


@dataclass(frozen=True)
class ChartSpec:
    """What a `Chart` draws.

    `kind` is "bars" (first series as bars, the others as reference lines)
    or "log" (every series as a line). `span_s` is the time the x axis covers,
    `res_s` the seconds each value covers.
    """

    kind: str
    series: tuple[Series, ...]
    span_s: float
    res_s: float = 1.0
    line_chars: tuple[str, ...] = field(default=("─", "┄"))


class Chart(Widget):
    """A chart with a y-axis on the left and a time axis at the bottom.

    Set `spec` (a `ChartSpec`) to change what it draws; it repaints only when
    the spec or its size changes. Below 3 rows it draws no time axis.
    """

    DEFAULT_CSS = """
    Chart {
        height: 1fr;
        width: 1fr;
    }
    """

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self._spec: ChartSpec | None = None
        self._cache: tuple[tuple[int, int], Content] | None = None
        self.scale_text = ""  # the scale as words, for tests and the border

    @property
    def spec(self) -> ChartSpec | None:
        return self._spec

    @spec.setter
    def spec(self, spec: ChartSpec | None) -> None:
        if spec == self._spec:
            return
        self._spec = spec
        self._cache = None
        self.refresh()

    def render(self) -> Content:
        width, height = self.content_size
        if self._cache is not None and self._cache[0] == (width, height):
            return self._cache[1]
        content = self._draw(width, height)
        self._cache = ((width, height), content)
        return content

    def _draw(self, width: int, height: int) -> Content:
        spec = self._spec
        if spec is None or width < 8 or height < 1:
            return Content("")
        axis = height >= 3
        rows = height - 1 if axis else height
        if spec.kind == "log":
            labels, plot = self._log(spec, rows, width)
        else:
            labels, plot = self._bars(spec, rows, width)
        return Content("\n").join(self._lines(labels, plot, axis, spec, width))

    def _label_width(self, labels: dict[int, str]) -> int:
        return max((len(text) for text in labels.values()), default=1)

    def _lines(
        self,
        labels: dict[int, str],
        plot: Callable[[int], list[Row]],
        axis: bool,
        spec: ChartSpec,
        width: int,
    ) -> list[Content]:
        label_width = self._label_width(labels)
        columns = width - label_width - 1
        rows = plot(columns)
        lines = []
        for index, row in enumerate(rows):
            tick = "┤" if index in labels else "│"
            lines.append(
                Content.assemble(
                    (labels.get(index, "").rjust(label_width), AXIS_STYLE), (tick, AXIS_STYLE), *row
                )
            )
        if axis:
            lines.append(
                Content.assemble(
                    (labels.get(len(rows), "").rjust(label_width), AXIS_STYLE),
                    (time_axis(columns, spec.span_s), AXIS_STYLE),
                )
            )
        return lines

    def _bars(
        self, spec: ChartSpec, rows: int, width: int
    ) -> tuple[dict[int, str], Callable[[int], list[Row]]]:
        bars, *refs = spec.series
        peak = max(
            (value for series in spec.series for value in series.values if value is not None), default=0.0
        )
        top = nice_top(peak * 1.05)
        labels = {0: short_number(top), rows: "0"}
        grid = []
        if rows >= 4:
            # the half-way value, on the row whose range holds it
            row = rows - 1 - min(rows - 1, math.floor(rows / 2 + 1e-9))
            labels.setdefault(row, short_number(top / 2))
            grid.append(row)
        self.scale_text = f"0..{short_number(top)} linear"

        def plot(columns: int) -> list[Row]:
            values = resample(bars.values, spec.res_s, spec.span_s, columns, bars.how)
            lines = [
                (resample(ref.values, spec.res_s, spec.span_s, columns, ref.how), char, ref.style)
                for ref, char in zip(refs, spec.line_chars, strict=False)
            ]
            # Drawn last to first: the first reference line wins a shared cell.
            return bar_rows(values, top, rows, bars.style, lines[::-1], grid)

        return labels, plot

    def _log(
        self, spec: ChartSpec, rows: int, width: int
    ) -> tuple[dict[int, str], Callable[[int], list[Row]]]:
        everything = [value for series in spec.series for value in series.values]
        lo, hi = log_range(everything)
        dots_y = rows * 4
        labels: dict[int, str] = {}
        grid = []
        for decade in range(lo, hi + 1):
            dot = round((decade - lo) / (hi - lo) * (dots_y - 1))
            row = (dots_y - 1 - dot) // 4
            if row not in labels and all(abs(row - other) > 0 for other in labels):
                labels[row] = short_millis(10.0**decade)
                grid.append(row)
        self.scale_text = f"{short_millis(10.0**lo)}..{short_millis(10.0**hi)} log"

        def plot(columns: int) -> list[Row]:
            series = [
                (resample(s.values, spec.res_s, spec.span_s, columns * 2, s.how), s.style)
                for s in spec.series
            ]
            return log_rows(series, lo, hi, rows, columns, grid)

        return labels, plot
