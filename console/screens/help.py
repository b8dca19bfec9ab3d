"""The help screen: every key the console answers to and what it does, by section."""

from __future__ import annotations

import textwrap

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.content import Content
from textual.events import Resize
from textual.screen import ModalScreen
from textual.widgets import Static

#: (section, [(keys, binding id or "", description)])
HelpSections = list[tuple[str, list[tuple[str, str, str]]]]


def help_content(sections: HelpSections, width: int) -> Content:
    """Sections of "key  description (id)" lines, descriptions wrapped under
    themselves (a hanging indent) to fit `width` columns."""
    rows = [row for _, section_rows in sections for row in section_rows]
    key_width = max((len(key) for key, _, _ in rows), default=4) + 2
    text_width = max(20, width - key_width)
    lines: list[Content] = []
    for title, section_rows in sections:
        if lines:
            lines.append(Content(""))
        lines.append(Content.styled(title, "b $text-primary"))
        for key, binding_id, description in section_rows:
            # Plain text plus a marker for the id, so the id is wrapped with the words.
            words = f"{description}  ({binding_id})" if binding_id else description
            wrapped = textwrap.wrap(words, text_width) or [""]
            for index, part in enumerate(wrapped):
                # Content, not markup: keys such as "[" must not be read as tags.
                head = (
                    Content.styled(key.ljust(key_width), "b $text-accent") if index == 0 else " " * key_width
                )
                if binding_id and part.endswith(f"({binding_id})"):
                    part_content = Content.assemble(
                        part[: -len(binding_id) - 2], (f"({binding_id})", "$text-muted")
                    )
                else:
                    part_content = Content(part)
                lines.append(Content.assemble(head, part_content))
    return Content("\n").join(lines)


class HelpScreen(ModalScreen[None]):
    """A modal, scrollable list of keys by section, as currently mapped.

    The rows come from the app (after the user's keymap is applied), so a
    remapped key is shown as the user will press it. It scrolls with the
    arrows, PgUp/PgDn, Home/End or j/k, so nothing is cut off at 80x24.
    """

    BINDINGS = [
        Binding("escape,question_mark,q", "close", "Close help", id="close_help"),
        Binding("j,down", "scroll('down')", "Down", show=False),
        Binding("k,up", "scroll('up')", "Up", show=False),
        Binding("pagedown,space", "scroll('page_down')", "Page down", show=False),
        Binding("pageup", "scroll('page_up')", "Page up", show=False),
        Binding("end", "scroll('end')", "End", show=False),
        Binding("home", "scroll('home')", "Home", show=False),
    ]

    AUTO_FOCUS = None

    def __init__(self, sections: HelpSections) -> None:
        super().__init__()
        self.sections = sections
        self._width = 0

    def compose(self) -> ComposeResult:
        with Vertical(id="help-box"):
            # Not focusable: its own animated Home/End would win over the keys below.
            with VerticalScroll(id="help-body", can_focus=False):
                yield Static(help_content(self.sections, 80), id="help-lines")
            yield Static(
                "[$text-muted]↑↓ PgUp PgDn scroll · remap with a keymap (action id → key) · Ctrl+P palette · Esc close[/]",
                id="help-foot",
            )

    def on_mount(self) -> None:
        self.query_one("#help-box").border_title = "Help · keys"

    def on_resize(self, event: Resize) -> None:
        body = self.query_one("#help-body", VerticalScroll)
        width = body.scrollable_content_region.width - 1
        if width > 0 and width != self._width:
            self._width = width
            self.query_one("#help-lines", Static).update(help_content(self.sections, width))

    def action_scroll(self, how: str) -> None:
        """Scroll at once (no animation: a held key must not queue up motion)."""
        body = self.query_one("#help-body", VerticalScroll)
        moves = {
            "down": body.scroll_down,
            "up": body.scroll_up,
            "page_down": body.scroll_page_down,
            "page_up": body.scroll_page_up,
            "end": body.scroll_end,
            "home": body.scroll_home,
        }
        moves[how](animate=False)

    def action_close(self) -> None:
        self.dismiss(None)
