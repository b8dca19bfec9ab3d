"""Image parts of LLM prompts: sizes read from real headers, each provider's rule, the fallbacks."""

from __future__ import annotations

import base64
import random
import struct
import zlib

from hypothesis import given
from hypothesis import strategies as st

from ratedeck.engine.limits import images
from ratedeck.engine.limits.costs import CostModel, prompt_tokens
from ratedeck.engine.limits.images import (
    anthropic_image_tokens,
    anthropic_max_tokens,
    data_size,
    image_size,
    openai_image_tokens,
    openai_max_tokens,
)

# ---------------------------------------------------------------- real headers, built here


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def png(width: int, height: int, payload: int = 0) -> bytes:
    """A PNG: signature, IHDR (8-bit RGB), an IDAT of `payload` bytes, IEND."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    body = random.Random(7).randbytes(payload) if payload else zlib.compress(b"\x00" * 4)
    return b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", ihdr) + _chunk(b"IDAT", body) + _chunk(b"IEND", b"")


def _segment(marker: int, data: bytes) -> bytes:
    return bytes([0xFF, marker]) + struct.pack(">H", len(data) + 2) + data


def jpeg(width: int, height: int, exif: int = 0, sof: int = 0xC0) -> bytes:
    """A JPEG: SOI, APP0 (JFIF), an APP1 of `exif` bytes, DQT, DHT, SOFn, EOI."""
    out = b"\xff\xd8" + _segment(0xE0, b"JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00")
    while exif > 0:  # an APP segment holds at most 65533 bytes
        n = min(exif, 65000)
        out += _segment(0xE1, b"Exif\x00\x00" + b"\x00" * (n - 6))
        exif -= n
    out += _segment(0xDB, b"\x00" + bytes(64))
    out += _segment(0xC4, b"\x00" + bytes(16) + b"\x00")  # DHT shares the SOF range: not a size
    out += _segment(sof, struct.pack(">BHHB", 8, height, width, 3) + b"\x01\x22\x00\x02\x11\x01\x03\x11\x01")
    return out + b"\xff\xd9"


def gif(width: int, height: int) -> bytes:
    return b"GIF89a" + struct.pack("<HHBBB", width, height, 0, 0, 0) + b",\x00\x00\x00\x00" + b";"


def _riff(chunk: bytes, data: bytes) -> bytes:
    body = b"WEBP" + chunk + struct.pack("<I", len(data)) + data
    return b"RIFF" + struct.pack("<I", len(body)) + body


def webp_vp8(width: int, height: int) -> bytes:
    # Frame tag (key frame), start code, then 14-bit width and height (scale bits 0).
    return _riff(b"VP8 ", b"\x50\x02\x00" + b"\x9d\x01\x2a" + struct.pack("<HH", width, height) + bytes(10))


def webp_vp8l(width: int, height: int) -> bytes:
    bits = (width - 1) | (height - 1) << 14
    return _riff(b"VP8L", b"\x2f" + struct.pack("<I", bits) + bytes(8))


def webp_vp8x(width: int, height: int) -> bytes:
    canvas = (width - 1).to_bytes(3, "little") + (height - 1).to_bytes(3, "little")
    return _riff(b"VP8X", b"\x10\x00\x00\x00" + canvas)


def data_uri(raw: bytes, media: str = "image/png") -> str:
    return f"data:{media};base64," + base64.b64encode(raw).decode()


# ---------------------------------------------------------------- headers


def test_each_formats_header_gives_its_size():
    assert image_size(png(1600, 1200)) == (1600, 1200)
    assert image_size(jpeg(640, 480)) == (640, 480)
    assert image_size(jpeg(3000, 2000, sof=0xC2)) == (3000, 2000)  # progressive
    assert image_size(gif(320, 200)) == (320, 200)
    assert image_size(webp_vp8(1024, 768)) == (1024, 768)
    assert image_size(webp_vp8l(800, 600)) == (800, 600)
    assert image_size(webp_vp8x(4000, 3000)) == (4000, 3000)
    assert image_size(b"not an image at all") is None


def test_a_jpeg_whose_metadata_comes_first_is_read_past_the_first_few_kb():
    raw = jpeg(1920, 1080, exif=100_000)  # SOF at ~100 KB, beyond the first 4 KB decoded
    assert image_size(raw[:4096]) is None
    assert data_size(data_uri(raw, "image/jpeg")) == (1920, 1080)


def test_only_the_header_is_decoded(monkeypatch):
    decoded: list[int] = []
    real = base64.b64decode
    monkeypatch.setattr(images.base64, "b64decode", lambda s, validate: decoded.append(len(s)) or real(s))
    assert data_size(data_uri(png(1600, 1200, payload=1_000_000))) == (1600, 1200)
    assert decoded and max(decoded) <= images.HEAD_CHARS  # of ~1.33 MB of base64


def test_a_truncated_or_garbled_data_uri_is_unreadable_and_never_raises():
    uri = data_uri(png(1600, 1200))
    assert data_size(uri[:30]) is None  # cut inside the IHDR
    assert data_size("data:image/png;base64,!!!!not base64!!!!") is None
    assert data_size("data:image/png;base64,") is None
    assert data_size(data_uri(b"\xff\xd8\xff\xe0\x00")) is None  # a JPEG cut before its SOF
    assert data_size(data_uri(jpeg(10, 10)[:-20])) is None
    wrapped = base64.encodebytes(png(300, 200)).decode()  # MIME-style, a line break every 76 characters
    assert data_size("data:image/png;base64," + wrapped) == (300, 200)


@given(st.binary(max_size=200))
def test_any_bytes_give_a_size_or_none(raw):
    size = image_size(raw)
    assert size is None or (size[0] > 0 and size[1] > 0)


@given(st.text(max_size=300))
def test_any_text_gives_a_size_or_none(text):
    data_size(text)
    data_size("data:image/png;base64," + text)


# ---------------------------------------------------------------- OpenAI's rule


def test_openai_tiles_follow_the_guides_examples():
    assert openai_image_tokens("gpt-4o", 1024, 1024, "high") == 85 + 4 * 170  # 768x768: 4 tiles
    assert openai_image_tokens("gpt-4o", 2048, 4096, "high") == 85 + 6 * 170  # 768x1536: 6 tiles
    assert openai_image_tokens("gpt-4o", 4096, 8192, "auto") == 1105  # auto counts as high
    assert openai_image_tokens("gpt-4o", 4096, 8192, "low") == 85
    assert openai_image_tokens("gpt-4o", 128, 64, "high") == 85 + 170  # small images are not enlarged
    assert openai_image_tokens("gpt-4o-mini", 1024, 1024, "high") == 2833 + 4 * 5667
    assert openai_image_tokens("gpt-4o-mini-2024-07-18", 10, 10, "low") == 2833
    assert openai_image_tokens("o3", 1024, 1024, "high") == 75 + 4 * 150
    assert openai_image_tokens("gpt-4.1-2025-04-14", 1024, 1024, "high") == 765


def test_openai_patches_follow_the_guides_examples():
    assert images.openai_patches(1024, 1024) == 1024
    assert images.openai_patches(1800, 2400) == 1452  # scaled down to fit 1536
    assert openai_image_tokens("gpt-4.1-mini", 1024, 1024) == 1659  # 1024 x 1.62, rounded up
    assert openai_image_tokens("gpt-4.1-nano", 1024, 1024, "low") == 2520  # detail does not apply
    assert openai_image_tokens("o4-mini", 1800, 2400) == 2498  # 1452 x 1.72


def test_openai_maximum_is_the_largest_an_image_can_cost():
    assert openai_max_tokens("gpt-4o") == 85 + 8 * 170
    assert openai_max_tokens("gpt-4o", "low") == 85
    assert openai_max_tokens("gpt-4.1-mini") == 2489  # 1536 x 1.62
    for w, h in [(768, 2048), (2048, 2048), (20000, 100), (100, 20000), (5000, 3000), (513, 513)]:
        assert openai_image_tokens("gpt-4o", w, h, "high") <= openai_max_tokens("gpt-4o")
        assert openai_image_tokens("o4-mini", w, h) <= openai_max_tokens("o4-mini")


sides = st.integers(min_value=1, max_value=30000)


@given(sides, sides, st.sampled_from(["low", "high", "auto"]))
def test_every_image_costs_at_least_a_token_and_at_most_the_models_maximum(w, h, detail):
    for model in ("gpt-4o", "gpt-4o-mini", "o3", "gpt-4.1-mini", "o4-mini"):
        assert 1 <= openai_image_tokens(model, w, h, detail) <= openai_max_tokens(model, detail)
    for model in ("claude-sonnet-4-5", "claude-opus-4-7"):
        assert 1 <= anthropic_image_tokens(model, w, h) <= anthropic_max_tokens(model)


def test_a_very_thin_image_is_capped_not_shrunk_to_nothing():
    assert images.openai_patches(1, 100000) == 1536
    assert images.openai_patches(40, 1) == 2


# ---------------------------------------------------------------- Anthropic's rule


def test_anthropic_counts_about_width_times_height_over_750_after_its_resize():
    assert anthropic_image_tokens("claude-sonnet-4-5", 1000, 1000) == 1334
    assert abs(anthropic_image_tokens("claude-sonnet-4-5", 1092, 1092) - 1590) <= 0.05 * 1590
    # Larger than 1568 px or ~1,600 tokens: scaled down to about 1,600 tokens.
    assert abs(anthropic_image_tokens("claude-sonnet-4-5-20250929", 4000, 3000) - 1600) <= 0.05 * 1600
    assert anthropic_image_tokens("claude-haiku-4-5", 8000, 200) <= (1568 * 40) / 750 + 60
    # Claude Opus 4.7 reads up to ~3.75 MP.
    assert abs(anthropic_image_tokens("claude-opus-4-7", 4000, 3000) - 5000) <= 0.05 * 5000


def test_anthropic_maximum_is_the_largest_an_image_can_cost():
    most = anthropic_max_tokens("claude-sonnet-4-5")
    assert 1600 <= most <= 1700
    assert anthropic_max_tokens("claude-opus-4-7") >= 5000
    for w, h in [(1568, 765), (8000, 8000), (1092, 1092), (30, 5000), (2000, 1000)]:
        assert anthropic_image_tokens("claude-sonnet-4-5", w, h) <= most


# ---------------------------------------------------------------- in a request's estimate

ONE_MB_PNG = data_uri(png(1600, 1200, payload=1_000_000))


def test_a_1mb_png_is_reserved_within_10_percent_of_openais_rule():
    # 1600x1200 high: 1024x768 after scaling, 2x2 tiles: 85 + 4 x 170.
    formula = 765
    chat = {
        "model": "gpt-4o",
        "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": ONE_MB_PNG}}]}],
    }
    responses = {
        "model": "gpt-4o",
        "input": [{"role": "user", "content": [{"type": "input_image", "image_url": ONE_MB_PNG}]}],
    }
    for body in (chat, responses):
        assert abs(prompt_tokens(body) - formula) <= 0.1 * formula
    assert len(ONE_MB_PNG) // 4 > 300_000  # what a quarter of its characters would have reserved


def test_a_1mb_png_is_reserved_within_10_percent_of_anthropics_rule():
    # 1600x1200 = 1.92 MP, scaled to ~1.2 MP: about 1,600 tokens.
    formula = 1600
    source = {"type": "base64", "media_type": "image/png", "data": ONE_MB_PNG.split(",", 1)[1]}
    body = {
        "model": "claude-sonnet-4-5",
        "max_tokens": 10,
        "messages": [{"role": "user", "content": [{"type": "image", "source": source}]}],
    }
    units = CostModel().units(body)
    assert abs(units["input_tokens"] - formula) <= 0.1 * formula
    assert units["tokens"] == units["input_tokens"] + 10
    in_tool_result = {
        "model": "claude-sonnet-4-5",
        "messages": [
            {
                "role": "user",
                "content": [{"type": "tool_result", "content": [{"type": "image", "source": source}]}],
            }
        ],
    }
    assert abs(prompt_tokens(in_tool_result) - formula) <= 0.1 * formula


def test_an_image_by_url_or_unreadable_counts_at_the_models_maximum():
    url = "https://example.com/cat.png"
    garbled = "data:image/png;base64,iVBORw0K"
    for ref in (url, garbled):
        chat = {
            "model": "gpt-4o",
            "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": ref}}]}],
        }
        assert prompt_tokens(chat) == 85 + 8 * 170
        low = {"type": "image_url", "image_url": {"url": ref, "detail": "low"}}
        assert prompt_tokens({"model": "gpt-4o", "messages": [{"role": "user", "content": [low]}]}) == 85
    by_file = {"type": "input_image", "file_id": "file-123"}
    assert prompt_tokens({"model": "gpt-4.1-mini", "input": [by_file]}) == 2489
    for source in (
        {"type": "url", "url": url},
        {"type": "base64", "data": "@@@@"},
        {"type": "file", "file_id": "f"},
    ):
        block = {"type": "image", "source": source}
        body = {"model": "claude-sonnet-4-5", "messages": [{"role": "user", "content": [block]}]}
        assert prompt_tokens(body) == anthropic_max_tokens("claude-sonnet-4-5")


def test_text_is_counted_as_before_beside_an_image():
    text_only = {
        "model": "gpt-4o",
        "system": "x" * 9,
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "z" * 5}]},
            {"role": "user", "content": "y" * 8},
        ],
    }
    assert prompt_tokens(text_only) == 3 + 2 + 2
    with_image = {
        **text_only,
        "messages": [
            *text_only["messages"],
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": data_uri(png(512, 512)), "detail": "high"}}
                ],
            },
        ],
    }
    assert prompt_tokens(with_image) == 7 + 85 + 170
