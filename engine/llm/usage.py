"""An answer's usage: its JSON body parsed once, its `usage` read into a typed `Usage`.

The body is parsed at most once per answer (`answer_doc`, kept on the `Outcome`): the
spend meter, pricing and a budget's settle (`field`, like "usage.output_tokens") all
read that one parse. A streamed answer's usage arrives as the transport merged it from
the stream's events (OpenAI's last chunk; Anthropic's message_start and message_delta),
as the body ``{"usage": {...}}``: the same shapes.

Shapes (`Usage.of`):
- OpenAI Chat Completions: `prompt_tokens` (cached ones included),
  `prompt_tokens_details.cached_tokens`, `completion_tokens` (reasoning included).
- OpenAI Responses: `input_tokens` (cached included), `input_tokens_details.cached_tokens`,
  `output_tokens`.
- Anthropic Messages: `input_tokens` (after the last cache breakpoint, so cache reads and
  writes are NOT in it), `cache_read_input_tokens`, `cache_creation_input_tokens`
  (optionally split by lifetime in `cache_creation.ephemeral_5m_input_tokens` /
  `ephemeral_1h_input_tokens`), `output_tokens`.
A count that is absent, null, negative or not a number is 0.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ratedeck.engine.http.outcome import UNREAD, Outcome


@dataclass(frozen=True, slots=True)
class Usage:
    """What one answer used, in tokens."""

    #: Every input token, cached, read from and written to a cache included (the report's).
    input: int
    output: int
    #: Input tokens billed at the plain input price.
    uncached: int
    #: Input tokens read from a cache (OpenAI's cached, Anthropic's cache reads).
    cached: int = 0
    #: Input tokens written to Anthropic's cache, 5-minute and 1-hour lifetime.
    written_5m: int = 0
    written_1h: int = 0

    @classmethod
    def of(cls, usage: Any) -> Usage | None:
        """A `usage` object in any shape above; None when it is not an object."""
        if not isinstance(usage, Mapping):
            return None
        if "prompt_tokens" in usage or "completion_tokens" in usage:  # Chat Completions
            prompt = count(usage.get("prompt_tokens"))
            cached = min(prompt, _detail(usage, "prompt_tokens_details"))
            return cls(prompt, count(usage.get("completion_tokens")), prompt - cached, cached)
        inp = count(usage.get("input_tokens"))
        out = count(usage.get("output_tokens"))
        if "input_tokens_details" in usage:  # Responses: input_tokens includes the cached ones
            cached = min(inp, _detail(usage, "input_tokens_details"))
            return cls(inp, out, inp - cached, cached)
        # Anthropic: input_tokens excludes cache reads and writes, counted apart.
        read = count(usage.get("cache_read_input_tokens"))
        created = count(usage.get("cache_creation_input_tokens"))
        split = usage.get("cache_creation")
        if isinstance(split, Mapping):
            w5 = count(split.get("ephemeral_5m_input_tokens"))
            w1 = count(split.get("ephemeral_1h_input_tokens"))
        else:  # no split given: the default lifetime, 5 minutes
            w5, w1 = created, 0
        return cls(inp + read + created, out, inp, read, w5, w1)


def count(value: Any) -> int:
    """A token count from an answer; anything else (absent, null, text) is 0."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return 0
    return max(0, int(value))


def _detail(usage: Mapping[str, Any], name: str) -> int:
    details = usage.get(name)
    return count(details.get("cached_tokens")) if isinstance(details, Mapping) else 0


def answer_doc(result: Outcome) -> Any:
    """The answer's JSON body, parsed on the first ask and kept on `result`; None when it
    has none or it is not JSON."""
    doc = getattr(result, "doc", UNREAD)
    if doc is UNREAD:
        doc = _parse(getattr(result.response, "body", None))
        try:
            result.doc = doc
        except AttributeError:
            pass  # an outcome of a test's own making: parsed again if asked again
    return doc


def _parse(body: Any) -> Any:
    if not isinstance(body, (bytes, str)) or not body:
        return None
    try:
        return json.loads(body)
    except (ValueError, RecursionError):
        return None


def usage_of(result: Outcome) -> Usage | None:
    """The answer's `usage`, or None when it reports none."""
    if getattr(result, "doc", UNREAD) is UNREAD:
        body = getattr(result.response, "body", None)
        if isinstance(body, bytes) and b'"usage"' not in body:
            return None  # no usage to read: not worth parsing the whole answer
    doc = answer_doc(result)
    return Usage.of(doc.get("usage")) if isinstance(doc, dict) else None


def field(result: Outcome, path: str) -> int | None:
    """A whole number at the dotted `path` of the answer's JSON body (a budget's `settle`,
    like "usage.output_tokens"), rounded up; None when it holds none."""
    node = answer_doc(result)
    for part in path.split("."):
        if not isinstance(node, dict):
            return None
        node = node.get(part)
    if isinstance(node, bool) or not isinstance(node, (int, float)) or not node >= 0:
        return None
    return math.ceil(node)
