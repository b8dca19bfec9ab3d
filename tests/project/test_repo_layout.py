"""The repo root holds pyproject.toml, README.md and the project's folders, nothing else:
no test's leftover, no generated file (generated schemas go under docs/)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ROOT_FILES = {"pyproject.toml", "README.md"}


def _git(*args: str) -> list[str]:
    git = shutil.which("git")
    if git is None or not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    proc = subprocess.run([git, *args], cwd=REPO, capture_output=True, text=True, timeout=60, check=True)
    return proc.stdout.splitlines()


def stray_root_files(paths: list[str]) -> list[str]:
    """The top-level files among `paths` (git's slash-separated names) that do not belong at the root."""
    return sorted({p for p in paths if "/" not in p and not p.startswith(".") and p not in ROOT_FILES})


def test_stray_finder_finds_a_leftover():
    paths = ["README.md", "pyproject.toml", ".gitignore", "engine/engine.py", "bad.toml"]
    assert stray_root_files(paths) == ["bad.toml"]


def test_the_root_tracks_only_pyproject_readme_and_folders():
    assert stray_root_files(_git("ls-files")) == []


def test_no_untracked_file_was_left_at_the_root():
    # Files a test (or a run) wrote into the working directory instead of tmp_path; ignored
    # artefacts (.gitignore: reports, graveyards, build output) are not listed by git.
    assert stray_root_files(_git("ls-files", "--others", "--exclude-standard")) == []
