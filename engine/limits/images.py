"""The tokens an image part of an LLM prompt costs, by each provider's documented rule.

An image counts by its size in pixels, not its bytes: a 1 MB PNG is about
350,000 "tokens" by a quarter of its base64 characters, but the provider
bills it a few hundred to a few thousand. The size is read from the header of
a data URI (PNG IHDR, JPEG SOF, GIF logical screen, WebP VP8/VP8L/VP8X),
decoding only the first few KB of base64. An image whose size cannot be read
(given by URL or file id, or a truncated or garbled data URI) counts at the
most the model may bill for one image, so it is never under-reserved.

OpenAI (platform.openai.com/docs/guides/images-vision, "Calculating costs";
read through the search tool on 2026-11-26 as mirrored at
openai-hd4n6.mintlify.app/docs/guides/images, with the per-model numbers the
mirror cut off as quoted and measured on community.openai.com, threads 1262691
and 1344040):
- Tile models: `detail: "low"` costs the base tokens flat. `high`/`auto`: scale
  to fit 2048x2048, then (only if larger) so the shortest side is 768, count
  512px tiles; base + tiles x tile tokens. Base/tile: gpt-4o, gpt-4.1, gpt-4.5,
  gpt-4-turbo 85/170; gpt-4o-mini 2833/5667; o1, o3 75/150.
- Patch models (gpt-4.1-mini, gpt-4.1-nano, o4-mini, gpt-5-mini, gpt-5-nano):
  32px patches, at most 1536 (a larger image is scaled down to fit), times the
  model's multiplier (1.62, 2.46, 1.72, 1.62, 2.46); `detail` does not apply.
  (Thread 1344040 measures gpt-5-mini at 1.20 a patch: the documented 1.62
  over-reserves it, the safe side.)
- A model not named here counts by the gpt-4o rule.

Anthropic (platform.claude.com/docs/en/build-with-claude/vision and its earlier
copy docs.anthropic.com/en/docs/vision, read the same day; Opus 4.7's limit as
reported at its launch, the page's per-model list being cut off): an image
larger than the model's native resolution is first scaled down, keeping its
aspect ratio, to a long edge of 1568 px and about 1,600 tokens
(~1.15 MP); Claude Opus 4.7 reads up to 2576 px and ~3.75 MP. It then costs
about width x height / 750 tokens; the page's newer wording counts 28x28 px
patches, ceil(w/28) x ceil(h/28). The larger of the two is reserved. A model
not known to read at 1568 px counts by the larger limit.
"""

from __future__ import annotations

import base64
import binascii
import math
import re
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# ---------------------------------------------------------------- image headers

#: Base64 characters decoded to find a header: 4 KB of bytes, enough for every
#: format's size field except a JPEG whose metadata comes first.
HEAD_CHARS = 5464
#: A JPEG's SOF marker follows its APP segments (EXIF, ICC), each up to 64 KB.
JPEG_HEAD_CHARS = 262144

_DATA_URI = re.compile(r"data:[^,;]*(?:;[^,;]*)*;base64,", re.IGNORECASE)


def header_bytes(data: str, chars: int = HEAD_CHARS) -> bytes:
    """The first bytes of base64 `data` (with or without a `data:...;base64,` prefix); b'' when garbled."""
    match = _DATA_URI.match(data)
    start = match.end() if match else 0
    # Line breaks and spaces (MIME-style base64) are not data.
    text = "".join(data[start : start + chars].split())
    text = text[: len(text) - len(text) % 4]
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return b""


def image_size(head: bytes) -> tuple[int, int] | None:
    """(width, height) from an image's first bytes: PNG, JPEG, GIF or WebP; None when unreadable."""
    size: tuple[int, int] | None = None
    if head.startswith(b"\x89PNG\r\n\x1a\n") and head[12:16] == b"IHDR" and len(head) >= 24:
        size = struct.unpack(">II", head[16:24])
    elif head[:6] in (b"GIF87a", b"GIF89a") and len(head) >= 10:
        size = struct.unpack("<HH", head[6:10])
    elif head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        size = _webp_size(head)
    elif head[:2] == b"\xff\xd8":
        size = _jpeg_size(head)
    if size is None or size[0] <= 0 or size[1] <= 0:
        return None
    return size


def _webp_size(head: bytes) -> tuple[int, int] | None:
    chunk = head[12:16]
    if chunk == b"VP8 " and len(head) >= 30 and head[23:26] == b"\x9d\x01\x2a":
        width, height = struct.unpack("<HH", head[26:30])
        return width & 0x3FFF, height & 0x3FFF
    if chunk == b"VP8L" and len(head) >= 25 and head[20] == 0x2F:
        bits = int.from_bytes(head[21:25], "little")
        return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    if chunk == b"VP8X" and len(head) >= 30:
        return int.from_bytes(head[24:27], "little") + 1, int.from_bytes(head[27:30], "little") + 1
    return None


# SOF markers carry the frame size; C4 (DHT), C8 (JPG) and CC (DAC) share the range but do not.
_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}


def _jpeg_size(head: bytes) -> tuple[int, int] | None:
    i = 2
    while i + 4 <= len(head):
        if head[i] != 0xFF:
            return None
        marker = head[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker in (0x01, *range(0xD0, 0xD9)):  # markers without a length
            i += 2
            continue
        length = int.from_bytes(head[i + 2 : i + 4], "big")
        if marker in _SOF:
            if i + 9 > len(head):
                return None
            height, width = struct.unpack(">HH", head[i + 5 : i + 9])
            return width, height
        if length < 2:
            return None
        i += 2 + length
    return None


def data_size(data: str) -> tuple[int, int] | None:
    """(width, height) of base64 image data, decoding only its header; None when unreadable."""
    head = header_bytes(data)
    size = image_size(head)
    if size is None and head[:2] == b"\xff\xd8":
        size = image_size(header_bytes(data, JPEG_HEAD_CHARS))
    return size


# ---------------------------------------------------------------- OpenAI


@dataclass(frozen=True)
class Tiles:
    """OpenAI's tile rule: `base` tokens, plus `tile` per 512px tile in high detail."""

    base: int
    tile: int


@dataclass(frozen=True)
class Patches:
    """OpenAI's patch rule: 32px patches, at most 1536, times `multiplier`."""

    multiplier: float


PATCH = 32
PATCH_CAP = 1536
TILES_4O = Tiles(85, 170)

# Longest prefix first: gpt-4o-mini before gpt-4o, gpt-4.1-mini before gpt-4.1.
_OPENAI_RULES: tuple[tuple[str, Tiles | Patches], ...] = (
    ("gpt-4o-mini", Tiles(2833, 5667)),
    ("gpt-4.1-mini", Patches(1.62)),
    ("gpt-4.1-nano", Patches(2.46)),
    ("gpt-5-mini", Patches(1.62)),
    ("gpt-5-nano", Patches(2.46)),
    ("o4-mini", Patches(1.72)),
    ("gpt-4o", TILES_4O),
    ("gpt-4.1", TILES_4O),
    ("gpt-4.5", TILES_4O),
    ("gpt-4-turbo", TILES_4O),
    ("o1", Tiles(75, 150)),
    ("o3", Tiles(75, 150)),
)


def openai_rule(model: Any) -> Tiles | Patches:
    """The image rule for an OpenAI model; the gpt-4o rule for one not named."""
    if isinstance(model, str):
        for prefix, rule in _OPENAI_RULES:
            if model == prefix or model.startswith(prefix + "-"):
                return rule
    return TILES_4O


def _patches(width: float, height: float) -> int:
    return math.ceil(width / PATCH) * math.ceil(height / PATCH)


def openai_patches(width: int, height: int) -> int:
    """32px patches covering the image, scaled down to fit 1536 as the guide's example does."""
    if _patches(width, height) <= PATCH_CAP:
        return _patches(width, height)
    # Never enlarged: a very thin image is over the cap by its padding, not its area.
    shrink = min(1.0, math.sqrt(PATCH_CAP * PATCH**2 / (width * height)))
    w, h = width * shrink, height * shrink
    # Then to a whole number of patches across, so the count fits the cap.
    across = math.floor(w / PATCH)
    if across > 0:
        fit = across / (w / PATCH)
        w, h = w * fit, h * fit
    return min(PATCH_CAP, _patches(w, h))


def openai_image_tokens(model: Any, width: int, height: int, detail: Any = "auto") -> int:
    """Tokens of one image of `width` x `height` px sent to OpenAI `model` at `detail`."""
    rule = openai_rule(model)
    if isinstance(rule, Patches):
        return math.ceil(openai_patches(width, height) * rule.multiplier)
    if detail == "low":
        return rule.base
    w, h = float(width), float(height)
    if max(w, h) > 2048:
        scale = 2048 / max(w, h)
        w, h = w * scale, h * scale
    if min(w, h) > 768:
        scale = 768 / min(w, h)
        w, h = w * scale, h * scale
    # The tolerance keeps a side scaled to exactly 2048 or 768 from a float's last bit adding a tile.
    tiles = math.ceil(w / 512 - 1e-9) * math.ceil(h / 512 - 1e-9)
    return rule.base + tiles * rule.tile


def openai_max_tokens(model: Any, detail: Any = "auto") -> int:
    """The most one image may cost: a patch model's full cap, a tile model's 768x2048 (2x4 tiles)."""
    rule = openai_rule(model)
    if isinstance(rule, Patches):
        return math.ceil(PATCH_CAP * rule.multiplier)
    if detail == "low":
        return rule.base
    return rule.base + 8 * rule.tile


# ---------------------------------------------------------------- Anthropic


@dataclass(frozen=True)
class Native:
    """The largest image a Claude model reads before scaling it down."""

    long_edge: int
    pixels: float


#: Long edge 1568 px and ~1,600 tokens (1,600 x 750 px).
NATIVE_STANDARD = Native(1568, 1600 * 750)
#: Claude Opus 4.7: 2576 px on the long edge, ~3.75 MP.
NATIVE_HIGH = Native(2576, 3.75e6)
ANTHROPIC_PIXELS_PER_TOKEN = 750
ANTHROPIC_PATCH = 28

# The models the page's 1568 px limit is documented for (dated snapshots and the
# -0/-latest aliases included); the rest count at the larger one.
_STANDARD = re.compile(r"claude-3.*|claude-(?:(?:opus|sonnet)-4(?:-[0156])?|haiku-4-5)(?:-\d{8}|-latest)?")


def anthropic_native(model: Any) -> Native:
    """The native resolution a Claude model scales an image down to."""
    if isinstance(model, str) and _STANDARD.fullmatch(model):
        return NATIVE_STANDARD
    return NATIVE_HIGH


def anthropic_image_tokens(model: Any, width: int, height: int) -> int:
    """Tokens of one image of `width` x `height` px sent to Claude `model`."""
    native = anthropic_native(model)
    scale = min(1.0, native.long_edge / max(width, height), math.sqrt(native.pixels / (width * height)))
    w, h = width * scale, height * scale
    # The scaled area is at most the native pixels; the cap and the tolerance keep a float's
    # last bit from adding a token or a row of patches.
    by_area = min(
        math.ceil(w * h / ANTHROPIC_PIXELS_PER_TOKEN), math.ceil(native.pixels / ANTHROPIC_PIXELS_PER_TOKEN)
    )
    by_patch = math.ceil(w / ANTHROPIC_PATCH - 1e-9) * math.ceil(h / ANTHROPIC_PATCH - 1e-9)
    return max(by_area, by_patch)


def anthropic_max_tokens(model: Any) -> int:
    """The most one image may cost: the native limit's area, or its patches with the padding of
    an image as long as the limit allows (each side padded up to a whole patch)."""
    native = anthropic_native(model)
    by_area = math.ceil(native.pixels / ANTHROPIC_PIXELS_PER_TOKEN)
    across = math.ceil(native.long_edge / ANTHROPIC_PATCH)
    down = math.ceil(native.pixels / native.long_edge / ANTHROPIC_PATCH) + 1
    return max(by_area, across * down)


# ---------------------------------------------------------------- prompt parts


def _data(url: Any) -> str | None:
    """The base64 data of a data URI; None for a URL (its size is unknown here)."""
    if isinstance(url, str) and url[:5].lower() == "data:":
        return url
    return None


def openai_part_tokens(part: Mapping[str, Any], model: Any) -> int:
    """An OpenAI image part: Chat's {"type": "image_url", "image_url": {"url", "detail"}} or
    Responses' {"type": "input_image", "image_url": "...", "detail"}."""
    ref = part.get("image_url")
    detail = part.get("detail", "auto")
    if isinstance(ref, Mapping):
        detail = ref.get("detail", detail)
        ref = ref.get("url")
    if ref is None and part.get("file_id") is None:
        return 0  # no image given: the API refuses the part, nothing is billed
    data = _data(ref)
    size = data_size(data) if data is not None else None
    if size is None:
        return openai_max_tokens(model, detail)
    return openai_image_tokens(model, size[0], size[1], detail)


def anthropic_block_tokens(block: Mapping[str, Any], model: Any) -> int:
    """An Anthropic {"type": "image", "source": {...}} block: base64, url or file source."""
    source = block.get("source")
    if not isinstance(source, Mapping):
        return 0  # no image given: the API refuses the block, nothing is billed
    data = source.get("data") if source.get("type") == "base64" else None
    size = data_size(data) if isinstance(data, str) else None
    if size is None:
        return anthropic_max_tokens(model)
    return anthropic_image_tokens(model, size[0], size[1])


def part_tokens(part: Mapping[str, Any], model: Any) -> int | None:
    """Tokens of an image part of either provider; None when `part` is not an image."""
    kind = part.get("type")
    if kind in ("image_url", "input_image"):
        return openai_part_tokens(part, model)
    if kind == "image":
        return anthropic_block_tokens(part, model)
    return None
