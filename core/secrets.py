"""Masking API keys: no secret is ever shown in full."""

from __future__ import annotations


def mask_secret(secret: str) -> str:
    """Hide all but the last four characters ("…JYA6"); short secrets fully."""
    if len(secret) <= 8:
        return "…" + "*" * 4
    return "…" + secret[-4:]
