"""The pre-actor cooldown, kept only to be compared against (`tests/engine/test_gates.py`, the escalation rows).

The engine honours a server's delay by closing the budget's gate for every
sender (`ratedeck.engine.path.request_path.SharedGates`). Before that design, a delay held
back only the request that was told to wait; every other request of the same
key went on into the closed window, and an escalating server doubled its
penalty each time. `Engine(cfg, transport, cooldown=PerRequestCooldown())` runs it.
"""

from __future__ import annotations

from ratedeck.engine.gate import CooldownGate
from ratedeck.engine.request import Request


class PerRequestCooldown:
    """A server's delay holds back only the rejected request ("slightly more than the error said")."""

    __slots__ = ()

    def cool(self, gate: CooldownGate, req: Request, now: float, delay_s: float, reason: str) -> None:
        req.eligible_at = now + delay_s * 1.1
