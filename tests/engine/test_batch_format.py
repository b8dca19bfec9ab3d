"""Batch files in the providers' formats: detection, translation to workload lines, bad lines,
and the output lines (pure logic: engine/llm/batch.py and the workload reader)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ratedeck.engine.llm.batch import (
    BATCH_FIELD,
    BatchFormat,
    batch_format,
    failed,
    format_of,
    output_record,
    translate,
)
from ratedeck.engine.settings import ConfigError
from ratedeck.engine.sources.workload import read_jsonl, take_shape

CHAT = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "2+2?"}], "max_tokens": 5}
MSG = {"model": "claude-3-5-haiku-latest", "max_tokens": 20, "messages": [{"role": "user", "content": "hi"}]}


def openai_line(cid: str, **over) -> dict:
    return {"custom_id": cid, "method": "POST", "url": "/v1/chat/completions", "body": CHAT, **over}


def anthropic_line(cid: str, **over) -> dict:
    return {"custom_id": cid, "params": MSG, **over}


def write(tmp_path: Path, lines: list) -> str:
    path = tmp_path / "batch.jsonl"
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    return str(path)


def refused(tmp_path: Path, lines: list) -> str:
    with pytest.raises(ConfigError) as info:
        list(read_jsonl(write(tmp_path, lines)))
    return str(info.value)


# ---------------------------------------------------------------- in


def test_each_format_is_known_by_its_fields_and_a_ratedeck_line_stays_one():
    assert format_of(openai_line("a")) is BatchFormat.OPENAI
    assert format_of(anthropic_line("a")) is BatchFormat.ANTHROPIC
    assert format_of({"custom_id": "a", "_body": CHAT, "_path": "/v1/chat/completions"}) is None
    assert format_of({"custom_id": "a", "symbol": "ABC"}) is None
    assert format_of({"symbol": "ABC"}) is None


def test_an_openai_file_becomes_workload_lines_that_post_the_body_to_the_url(tmp_path):
    items = list(read_jsonl(write(tmp_path, [openai_line("r1"), "", openai_line("r2", method="post")])))
    assert [i["_id"] for i in items] == ["r1", "r2"]
    assert items[0] == {
        "_id": "r1",
        "_method": "POST",
        "_path": "/v1/chat/completions",
        "_body": CHAT,
        BATCH_FIELD: "openai",
    }
    shape = take_shape(dict(items[1]))
    assert shape is not None and shape.method == "POST" and shape.path == "/v1/chat/completions"
    assert shape.payload is not None and json.loads(shape.payload) == CHAT


def test_an_anthropic_file_posts_its_params_to_v1_messages(tmp_path):
    (item,) = read_jsonl(write(tmp_path, [anthropic_line("m1")]))
    assert item["_path"] == "/v1/messages" and item["_method"] == "POST" and item["_body"] == MSG
    assert batch_format(item) is BatchFormat.ANTHROPIC and item["_id"] == "m1"


@pytest.mark.parametrize(
    ("bad", "needle"),
    [
        (openai_line("r2", url="v1/chat"), "url must be a path on the target starting with /"),
        (openai_line("r2", body="hi"), "body must be a JSON object"),
        (openai_line("r2", method="GET"), "method must be POST"),
        (openai_line("r2", custom_id=""), "custom_id must be a non-empty string"),
        (openai_line("r2", custom_id=7), "custom_id must be a non-empty string, got 7"),
        ({"custom_id": "r2", "method": "POST", "url": "/v1/x"}, "needs body"),
        (openai_line("r2", metadata={}), "unknown: metadata"),
        (anthropic_line("r2"), "is an Anthropic Message Batches line"),
        ({"_id": "x"}, "needs body, custom_id, method, url (it has _id)"),
        ("[1, 2]", "must be a JSON object"),
        ("{not json", "not JSON"),
    ],
)
def test_a_bad_line_of_an_openai_file_is_named_by_its_number(tmp_path, bad, needle):
    text = refused(tmp_path, [openai_line("r1"), bad])
    assert "batch.jsonl: line 2" in text and needle in text, text


def test_a_bad_anthropic_line_and_a_line_of_another_format(tmp_path):
    text = refused(tmp_path, [anthropic_line("a"), anthropic_line("b", params=[1])])
    assert "line 2" in text and "params must be a JSON object" in text
    text = refused(tmp_path, [anthropic_line("a"), openai_line("b")])
    assert "line 2: is an OpenAI Batch line, but line 1 makes this an Anthropic Message Batches file" in text
    text = refused(tmp_path, [{"symbol": "A"}, openai_line("b")])
    assert "line 2: is an OpenAI Batch line, but line 1 is a ratedeck workload line" in text


def test_a_repeated_custom_id_is_refused_naming_both_lines(tmp_path):
    text = refused(tmp_path, [openai_line("r1"), openai_line("r2"), openai_line("r1")])
    assert "line 3: custom_id 'r1' is also the custom_id of line 1" in text


def test_translate_refuses_what_the_api_would():
    with pytest.raises(ValueError, match="needs params"):
        translate({"custom_id": "a"}, BatchFormat.ANTHROPIC)
    assert translate(openai_line("a", method="put"), BatchFormat.OPENAI)["_method"] == "PUT"


# ---------------------------------------------------------------- out


def test_openai_output_keeps_every_answer_errors_included_and_an_error_for_none():
    ok = output_record(BatchFormat.OPENAI, "r1", "succeeded", 200, {"id": "c1"}, "req_1", None)
    assert ok["custom_id"] == "r1" and ok["id"].startswith("batch_req_") and ok["error"] is None
    assert ok["response"] == {"status_code": 200, "request_id": "req_1", "body": {"id": "c1"}}
    assert not failed(ok)
    bad = output_record(
        BatchFormat.OPENAI, "r2", "graveyard", 400, {"error": {"message": "no"}}, None, "HTTP 400"
    )
    assert bad["response"]["status_code"] == 400 and bad["error"] is None and failed(bad)
    lost = output_record(BatchFormat.OPENAI, "r3", "graveyard", None, None, None, "connection refused")
    assert lost["response"] is None and lost["error"]["code"] == "request_failed"
    assert "connection refused" in lost["error"]["message"] and failed(lost)
    never = output_record(BatchFormat.OPENAI, "r4", "queued", 429, None, None, None)
    assert never["response"] is None and never["error"]["code"] == "batch_cancelled"
    late = output_record(BatchFormat.OPENAI, "r5", "expired", None, None, None, None)
    assert late["error"]["code"] == "batch_expired"


def test_anthropic_output_is_succeeded_errored_canceled_or_expired():
    message = {"id": "msg_1", "type": "message"}
    ok = output_record(BatchFormat.ANTHROPIC, "m1", "succeeded", 200, message, "req_9", None)
    assert ok["result"] == {"type": "succeeded", "message": message} and ok["request_id"] == "req_9"
    assert not failed(ok)
    api_error = {"type": "error", "error": {"type": "invalid_request_error", "message": "max_tokens"}}
    err = output_record(BatchFormat.ANTHROPIC, "m2", "graveyard", 400, api_error, "req_10", "HTTP 400")
    assert err["result"] == {"type": "errored", "error": {**api_error, "request_id": "req_10"}}
    lost = output_record(BatchFormat.ANTHROPIC, "m3", "uncertain", None, None, None, "timed out")
    assert lost["result"]["type"] == "errored" and lost["result"]["error"]["error"]["type"] == "api_error"
    assert "timed out" in lost["result"]["error"]["error"]["message"] and failed(lost)
    assert output_record(BatchFormat.ANTHROPIC, "m4", "queued", None, None, None, None)["result"] == {
        "type": "canceled"
    }
    assert output_record(BatchFormat.ANTHROPIC, "m5", "expired", None, None, None, None)["result"] == {
        "type": "expired"
    }


def test_a_hand_written_batch_field_needs_what_a_translated_line_has(tmp_path):
    text = refused(tmp_path, [{"_batch": "openai", "q": 1}])
    assert "line 1: _batch is what a batch file's line becomes" in text
    text = refused(tmp_path, [{"_batch": "gemini", "_id": "a", "_body": {}}])
    assert "line 1: _batch" in text
    # A translated line (a store's job, a replayed results line) reads as itself.
    line = {"_id": "a", "_method": "POST", "_path": "/v1/messages", "_body": MSG, BATCH_FIELD: "anthropic"}
    assert list(read_jsonl(write(tmp_path, [line]))) == [line]


def test_a_byte_order_mark_before_the_first_line_is_not_part_of_it(tmp_path):
    path = tmp_path / "bom.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps(openai_line("r1")).encode() + b"\n")
    assert [i["_id"] for i in read_jsonl(str(path))] == ["r1"]
