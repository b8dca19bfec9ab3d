"""What every panel fed by snapshots shares: the `snapshot` it shows and repaints only on change.

A panel derives from `SnapshotPanel` and from the widget it is (`Static` when it
shows text itself, `Vertical` when it holds a few): `class ErrorsPanel(SnapshotPanel,
Static)`. `SnapshotPanel` is a mixin, not a widget, so textual's styles and type
names still come from that widget. Its title is textual's `BORDER_TITLE`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from textual.reactive import reactive

from ratedeck.engine.snapshot import Snapshot

if TYPE_CHECKING:
    from textual.widget import Widget
    from textual.widgets import Static

    _Widget = Widget
else:
    _Widget = object


class SnapshotPanel(_Widget):
    """The latest `snapshot` (a reactive: its watcher repaints what changed, nothing repaints by
    itself), and the text and border subtitle last shown, so an unchanged refresh repaints nothing."""

    snapshot: reactive[Snapshot | None] = reactive(None, init=False, repaint=False)
    _text = ""  # the text last shown
    _subtitle: str | None = None  # the border subtitle last set (its getter gives markup back)

    def show_text(self, text: str, where: Static | None = None, *, layout: bool = False) -> bool:
        """Show `text` in `where` (this panel when None) if it changed; True if it did.

        `layout=False`: the place has a fixed size, so new text needs no relayout.
        """
        if text == self._text:
            return False
        self._text = text
        (where if where is not None else cast("Static", self)).update(text, layout=layout)
        return True

    def show_subtitle(self, subtitle: str) -> None:
        if subtitle != self._subtitle:
            self._subtitle = subtitle
            self.border_subtitle = subtitle
