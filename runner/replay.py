"""`ratedeck replay FILE [run flags]`: send the requests of a graveyard or results file again.

Each line of a graveyard file (`--graveyard`) or a results file
(`--results`) carries the request as the workload gave it: `params`,
`pool` and `line` (its `_id`, `_method`, `_path`, `_body`, `_weight`,
`_budget`). Replay makes those the workload of a new run, in file order, with
their original parameters (the id, the nonce and the key are the new run's
own). From a results file it takes the requests that did not succeed unless
told `--all` or `--only ENDINGS`; a graveyard file holds only requests that
did not succeed.

A line cut short (a run killed mid-write) or not JSON is skipped and
counted; a line with no `params` (a graveyard written before lines carried
them) cannot be replayed and is counted too.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from ratedeck.engine.request import LINE_FIELDS

ENDINGS = ("succeeded", "expired", "graveyard", "shed", "queued", "in_flight", "uncertain")
#: Not succeeded, and not uncertain: a write that may have happened is sent again only when asked.
DEFAULT_ENDINGS = tuple(e for e in ENDINGS if e not in ("succeeded", "uncertain"))


class ReplayError(ValueError):
    """The file cannot be replayed; the message is one line."""


@dataclass
class Replayable:
    items: list[dict] = field(default_factory=list)  # workload lines: params plus "_pool"
    skipped_broken: int = 0  # not JSON or cut short
    skipped_no_params: int = 0  # no "params": nothing to send again
    skipped_ending: int = 0  # an ending not asked for (succeeded, by default)

    def notes(self) -> list[str]:
        out = []
        if self.skipped_broken:
            out.append(f"{self.skipped_broken} line(s) not JSON or cut short, skipped")
        if self.skipped_no_params:
            out.append(f"{self.skipped_no_params} line(s) without params (an older graveyard), skipped")
        if self.skipped_ending:
            out.append(f"{self.skipped_ending} request(s) with other endings left out")
        return out


def parse_endings(text: str) -> tuple[str, ...]:
    names = tuple(x.strip() for x in text.split(",") if x.strip())
    unknown = [n for n in names if n not in ENDINGS]
    if unknown or not names:
        raise ReplayError(f"--only: expected endings from {', '.join(ENDINGS)}, got {text!r}")
    return names


def read_requests(path: str | os.PathLike, endings: tuple[str, ...] | None = DEFAULT_ENDINGS) -> Replayable:
    """The requests to send again from a graveyard or results file (`endings` None: all)."""
    p = Path(path)
    try:
        raw = p.read_bytes()
    except OSError as exc:
        raise ReplayError(f"{path}: cannot read: {exc.strerror or exc}") from None
    out = Replayable()
    for line in raw.decode("utf-8", "replace").splitlines():
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            out.skipped_broken += 1
            continue
        if not isinstance(obj, dict):
            out.skipped_broken += 1
            continue
        ending = obj.get("ending", "graveyard")  # graveyard lines before "ending" was written
        if endings is not None and ending not in endings:
            out.skipped_ending += 1
            continue
        params = obj.get("params")
        if not isinstance(params, dict):
            out.skipped_no_params += 1
            continue
        item = dict(params)
        given = obj.get("line")  # the line's underscore fields (an object _body, _path, _id, ...)
        if isinstance(given, dict):
            item.update((k, v) for k, v in given.items() if k in LINE_FIELDS)
        if obj.get("pool") is not None:
            item["_pool"] = obj["pool"]
        out.items.append(item)
    return out


def workload_file(items: list[dict]) -> str:
    """The items as a temporary JSONL workload file; the caller removes it."""
    fd, name = tempfile.mkstemp(prefix="ratedeck-replay-", suffix=".jsonl")
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        for item in items:
            fh.write(json.dumps(item) + "\n")
    return name
