"""ARCHITECTURE.md stays true: every path it names in backquotes exists."""

from __future__ import annotations

import re

from conftest import REPO

DOC = REPO / "ARCHITECTURE.md"


def named_paths() -> list[str]:
    text = DOC.read_text()
    found = re.findall(r"`([A-Za-z0-9_.\-]+(?:/[A-Za-z0-9_.\-]*)+)`", text)
    # The flow picture names source files plainly; check those too.
    found += re.findall(
        r"\b((?:pipeline|qemu-farm|pytest-tests|dashboards)/[A-Za-z0-9_./\-]+)", text
    )
    return sorted({p.rstrip("/.,") for p in found if not p.startswith("<")})


def test_every_path_the_map_names_exists():
    paths = named_paths()
    assert len(paths) >= 20, paths
    missing = [p for p in paths if not (REPO / p).exists()]
    assert not missing, f"ARCHITECTURE.md names paths that do not exist: {missing}"


def test_the_map_names_every_top_level_folder():
    text = DOC.read_text()
    top = sorted(
        p.name
        for p in REPO.iterdir()
        if p.is_dir() and not p.name.startswith(".") and p.name != "target"
    )
    missing = [d for d in top if f"`{d}/`" not in text]
    assert not missing, f"top-level folders the map does not describe: {missing}"
