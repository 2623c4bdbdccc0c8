"""Shared fixtures for phyfarm's own tests: the phyfarm binary and a runner."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

# The farm's plugin (options, fixtures, KCIDB results) is loaded by the
# repository's root conftest.py.


@dataclass
class Result:
    argv: list[str]
    code: int
    stdout: str
    stderr: str

    def describe(self) -> str:
        return (
            f"$ {' '.join(self.argv)}\nexit {self.code}\n"
            f"--- stdout ---\n{self.stdout[-3000:]}\n--- stderr ---\n{self.stderr[-3000:]}"
        )


class Phyfarm:
    """Runs the phyfarm CLI the way a user does."""

    def __init__(self, binary: Path) -> None:
        self.binary = binary

    def __call__(self, *args: str, timeout: float = 3600) -> Result:
        argv = [str(self.binary), *args]
        p = subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout, cwd=REPO, check=False
        )
        return Result(argv, p.returncode, p.stdout, p.stderr)


@pytest.fixture(scope="session")
def phyfarm() -> Phyfarm:
    binary = Path(os.environ.get("PHYFARM_BIN", REPO / "target/debug/phyfarm"))
    if not binary.exists():
        subprocess.run(["cargo", "build", "-p", "phyfarm"], cwd=REPO, check=True)
    return Phyfarm(binary)


@pytest.fixture(scope="session")
def podman() -> None:
    if shutil.which("podman") is None:
        pytest.skip("podman is not installed (run containers/host-setup.sh)")


def read_json(path: Path) -> dict:
    return json.loads(path.read_text())
