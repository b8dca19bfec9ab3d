"""What a request costs in tokens, estimated from its body before it is sent.

LLM APIs count tokens as well as requests, and a request's cost is known only
roughly when it goes: its prompt's tokens (estimated) plus the most it may
write (`max_tokens`). The estimate is reserved from every token budget the
request belongs to (all-or-nothing, with its other budgets); the answer then
settles it where the API settles (a budget's `settle` field, `KeyLimits.learn` in engine/path/key.py),
and the server's own counts, read on every answer, correct the rest.

Built in (`costs.estimate = "chars/4"`): a quarter of the characters of the
text the model reads, rounded up per piece (OpenAI's and Anthropic's own rule
of thumb; rounding each piece up never counts less than the whole). The text
is: each message's `content` (a string, or a list of parts with `text`), the
`system` prompt (Anthropic), and `prompt`/`input` (completions, embeddings).
An image part counts by its provider's rule for the body's `model`
(engine/limits/images.py): OpenAI's `image_url` (Chat) and `input_image`
(Responses, also inside `input` messages), Anthropic's `image` blocks (also
inside a `tool_result`), never by the characters of its base64.
Output: `max_tokens`, else `max_completion_tokens`, else `costs.max_tokens`.
A hook (`"module:function"`) gets the body and returns the input tokens (a
real tokenizer), or a dict of units to override.

`units(body)` returns {"input_tokens", "output_tokens", "tokens"} (tokens =
input + output); a request with no JSON object body costs no tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ratedeck.core.hooks import load_callable

from .images import part_tokens

#: The built-in estimate's name.
CHARS_4 = "chars/4"

Units = dict[str, int]
Estimator = Callable[[Mapping[str, Any]], Units]

_NONE: Units = {"input_tokens": 0, "output_tokens": 0, "tokens": 0}


def _quarter(text: str) -> int:
    return -(-len(text) // 4)


def _text_tokens(value: Any, model: Any = None) -> int:
    """Estimated tokens of a content value: a string, a list of parts or strings."""
    if isinstance(value, str):
        return _quarter(value)
    if isinstance(value, list):
        total = 0
        for part in value:
            if isinstance(part, str):
                total += _quarter(part)
            elif isinstance(part, dict):
                text = part.get("text")
                if isinstance(text, str):
                    total += _quarter(text)
                total += _image_tokens(part, model)
        return total
    return 0


def _image_tokens(part: dict[str, Any], model: Any) -> int:
    """An image part's tokens; images nested where the APIs allow them (a tool result, a
    Responses `input` message) are counted too, their text is left as it was."""
    tokens = part_tokens(part, model)
    if tokens is not None:
        return tokens
    nested = part.get("content")
    if isinstance(nested, list) and part.get("type") in ("tool_result", "message", None):
        # One level: the APIs nest image parts no deeper.
        return sum(part_tokens(p, model) or 0 for p in nested if isinstance(p, dict))
    return 0


def prompt_tokens(body: Mapping[str, Any]) -> int:
    """A quarter of the characters of everything the model reads, rounded up per piece,
    plus each image part by its provider's rule."""
    model = body.get("model")
    total = _text_tokens(body.get("system"), model)
    messages = body.get("messages")
    if isinstance(messages, list):
        for message in messages:
            if isinstance(message, dict):
                total += _text_tokens(message.get("content"), model)
    for name in ("prompt", "input"):
        total += _text_tokens(body.get(name), model)
    return total


def output_tokens(body: Mapping[str, Any], default: int) -> int:
    """The most the model may write: `max_tokens`, `max_completion_tokens`, else `default`."""
    for name in ("max_tokens", "max_completion_tokens"):
        value = body.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
    return default


class CostModel:
    """Estimates a body's tokens: the built-in chars/4, or a hook for the input tokens."""

    def __init__(self, estimate: str = CHARS_4, max_tokens: int = 1024):
        self.name = estimate
        self.max_tokens = max_tokens
        self._hook: Callable[[Mapping[str, Any]], Any] | None = None
        if estimate != CHARS_4:
            self._hook = load_hook(estimate)

    def units(self, body: Any) -> Units:
        """{"input_tokens", "output_tokens", "tokens"} for one request's body."""
        if not isinstance(body, dict):
            return _NONE
        out = output_tokens(body, self.max_tokens)
        if self._hook is None:
            inp = prompt_tokens(body)
            return {"input_tokens": inp, "output_tokens": out, "tokens": inp + out}
        got = self._hook(body)
        if isinstance(got, Mapping):
            units = {"input_tokens": prompt_tokens(body), "output_tokens": out}
            units.update(
                {k: _whole(got[k], self.name) for k in ("input_tokens", "output_tokens") if k in got}
            )
            total = got.get("tokens")
            units["tokens"] = (
                _whole(total, self.name)
                if total is not None
                else units["input_tokens"] + units["output_tokens"]
            )
            return units
        inp = _whole(got, self.name)
        return {"input_tokens": inp, "output_tokens": out, "tokens": inp + out}


def _whole(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 or value != value:
        raise ValueError(f"the cost hook {name} returned {value!r}, not a count of tokens")
    return int(-(-value // 1))


def load_hook(spec: str) -> Callable[[Mapping[str, Any]], Any]:
    """`module:function` imported; ValueError saying why when it cannot be."""
    if ":" not in spec:
        raise ValueError(f'must be "{CHARS_4}" or a hook "module:function", got {spec!r}')
    return load_callable(spec, "cost hook")
