"""The one place ratedeck creates files and directories: its user's alone, whatever the umask.

What ratedeck writes (graveyards, results, reports, stores, saved configs) may hold
requests, prompts and answers: data of the user's, or of a gateway's clients. So a file
ratedeck creates is 0600 and a directory it creates 0700, even under a umask of 022:
- a file it creates is made 0600 (`os.open` with that mode, then set exactly, so an odd
  umask cannot take the owner's bits away);
- a file it empties to write anew ("w") loses what group and others could do with it (a
  file the user made 0644 becomes 0600; nothing is ever loosened);
- a file it adds to ("a": a graveyard, a store run's results) keeps the mode the user gave
  it: the user's file, the user's choice;
- what is not a regular file (/dev/stdout, a pipe) is written as it is, never chmod'ed.
Docs: docs/files.md.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import IO, Any

__all__ = ["FILE_MODE", "DIR_MODE", "private_dir", "private_open", "private_write_text"]

FILE_MODE = 0o600
DIR_MODE = 0o700

_FLAGS = {"w": os.O_WRONLY | os.O_TRUNC, "a": os.O_WRONLY | os.O_APPEND, "x": os.O_WRONLY}


def private_open(
    path: str | os.PathLike[str], mode: str = "w", *, encoding: str | None = None, buffering: int = -1
) -> IO[Any]:
    """`open(path, mode)` for writing ("w", "a", "x", with "b" and "+" as `open` takes them),
    the file created 0600 (see the module doc). Raises `OSError` as `open` does."""
    kind = mode.replace("b", "").replace("+", "")
    if kind not in _FLAGS:
        raise ValueError(f"private_open writes: mode 'w', 'a' or 'x', got {mode!r}")
    flags = _FLAGS[kind] | getattr(os, "O_CLOEXEC", 0)
    if "+" in mode:
        flags = (flags & ~os.O_WRONLY) | os.O_RDWR
    try:  # created here: the file is ours, 0600 exactly
        fd = os.open(path, flags | os.O_CREAT | os.O_EXCL, FILE_MODE)
        created = True
    except FileExistsError:
        if kind == "x":
            raise
        fd = os.open(path, flags | os.O_CREAT, FILE_MODE)  # there already (or made just now by another)
        created = False
    try:
        _tighten(fd, created=created, emptied=kind == "w")
        return os.fdopen(
            fd, mode, encoding=None if "b" in mode else (encoding or "utf-8"), buffering=buffering
        )
    except BaseException:
        os.close(fd)
        raise


def _tighten(fd: int, *, created: bool, emptied: bool) -> None:
    """0600 for a file made now; group and others' bits off a regular file emptied now."""
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        return  # a device, a pipe: not a file of ours
    now = stat.S_IMODE(st.st_mode)
    if created:
        want = FILE_MODE
    elif emptied:
        want = now & FILE_MODE
    else:
        return
    if want != now:
        try:
            os.fchmod(fd, want)
        except OSError:
            if created:
                raise
            # someone else's file we may write but not chmod: written as its owner set it


def private_write_text(path: str | os.PathLike[str], text: str) -> None:
    """`text` as the whole of the file at `path` (UTF-8), created 0600; `OSError` as `open` raises."""
    with private_open(path, "w", encoding="utf-8") as fh:
        fh.write(text)


def private_dir(path: str | os.PathLike[str]) -> Path:
    """The directory `path`, with every missing part of it made 0700 (exactly, whatever the
    umask); the parts already there are left as they are. Raises `OSError` when one cannot
    be made (a file in the way, no permission)."""
    target = Path(path)
    missing: list[Path] = []
    part = target
    while not part.is_dir():
        missing.append(part)
        if part.parent == part:
            break
        part = part.parent
    for part in reversed(missing):
        try:
            os.mkdir(part, DIR_MODE)
        except FileExistsError:
            if not part.is_dir():
                raise
            continue  # made by another process just now: theirs to set
        os.chmod(part, DIR_MODE)
    return target
