"""A one-line labelled bar gauge that takes its colours from the theme."""

from __future__ import annotations

from textual.content import Content
from textual.reactive import reactive
from textual.widget import Widget


class Gauge(Widget):
    """`label ━━━━━━━━╺━━━━ value` on one line.

    `value`/`maximum` set the fill; `text` is what is written on the right;
    `level` ("ok", "warning", "error") picks the fill colour. With
    `maximum <= 0` there is no bar, only the text: used for quantities that
    have no ceiling (the main queue when backpressure is off).
    """

    DEFAULT_CSS = """
    Gauge {
        height: 1;
        width: 1fr;
    }
    """

    label: reactive[str] = reactive("")
    value: reactive[float] = reactive(0.0)
    maximum: reactive[float] = reactive(0.0)
    text: reactive[str] = reactive("")
    level: reactive[str] = reactive("ok")

    LABEL_WIDTH = 11

    def __init__(self, label: str, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self.label = label

    def show(self, value: float, maximum: float, text: str, level: str = "ok") -> None:
        """Set every field at once (one repaint, none if nothing changed)."""
        if (value, maximum, text, level) == (self.value, self.maximum, self.text, self.level):
            return
        self.set_reactive(Gauge.value, value)
        self.set_reactive(Gauge.maximum, maximum)
        self.set_reactive(Gauge.text, text)
        self.set_reactive(Gauge.level, level)
        self.refresh()

    def render(self) -> Content:
        colour = {"ok": "$success", "warning": "$warning", "error": "$error"}.get(self.level, "$primary")
        text_style = {"ok": "", "warning": "$text-warning", "error": "$text-error"}.get(self.level, "")
        width = self.content_size.width
        label = self.label[: self.LABEL_WIDTH - 1].ljust(self.LABEL_WIDTH)
        text = f" {self.text}"
        bar_width = max(0, width - len(label) - len(text))
        parts: list[tuple[str, str] | str] = [(label, "$text-muted")]
        if self.maximum > 0 and bar_width >= 4:
            fraction = min(1.0, max(0.0, self.value / self.maximum))
            filled = round(fraction * bar_width)
            parts.append(("━" * filled, colour))
            parts.append(("━" * (bar_width - filled), "$foreground 15%"))
        else:
            parts.append(" " * bar_width)
        parts.append((text, f"b {text_style}".strip()))
        return Content.assemble(*parts)
