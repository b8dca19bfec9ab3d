"""Command palette provider: every console control and every theme."""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

from textual.command import DiscoveryHit, Hit, Hits, Provider

if TYPE_CHECKING:
    from ratedeck.console.app import RatedeckApp


class ControlsProvider(Provider):
    """Lists the app's controls (by description, with their key) and themes."""

    def _commands(self) -> list[tuple[str, str, object]]:
        app: RatedeckApp = self.app  # type: ignore[assignment]
        commands: list[tuple[str, str, object]] = []
        for key, binding_id, description, action in app.control_rows():
            commands.append((description, f"key {key} · {binding_id}", partial(app.run_control, action)))
        for name in app.ratedeck_themes:
            commands.append((f"Theme: {name}", "switch the console's colours", partial(app.use_theme, name)))
        return commands

    async def discover(self) -> Hits:
        for name, help_text, callback in self._commands():
            yield DiscoveryHit(name, callback, help=help_text)  # type: ignore[arg-type]

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for name, help_text, callback in self._commands():
            score = matcher.match(name)
            if score > 0:
                yield Hit(score, matcher.highlight(name), callback, help=help_text)  # type: ignore[arg-type]
