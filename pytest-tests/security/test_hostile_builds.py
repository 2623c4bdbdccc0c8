"""Hostile pull requests, part 2: a series' Makefile runs in the build
sandbox. Each test runs a tiny Makefile in the real kbuild image through
phyfarm's own build path (`phyfarm sandbox-make`: the same Run, podman
flags, limits and artifact copy as a kernel build) and asserts the attack
fails, phyfarm says what stopped it, and the run ends with exit 1 (the
code under test) — never 0, and never a leak.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import REPO

SECRET = "runner-password-5b7d2e90"
#: crate::sandbox::UID_BASE: container root is this host uid.
UID_BASE = 524288


@dataclass
class Made:
    code: int
    stdout: str
    stderr: str
    seconds: float
    tree: Path
    out: Path

    @property
    def log(self) -> str:
        try:
            return (self.out / "build.log").read_text(errors="replace")
        except OSError:
            return ""

    def describe(self) -> str:
        return (
            f"exit {self.code} after {self.seconds:.1f}s\n--- stderr ---\n{self.stderr[-3000:]}"
            f"\n--- build.log ---\n{self.log[-3000:]}"
        )


def binary() -> Path:
    b = Path(os.environ.get("PHYFARM_BIN", REPO / "target/debug/phyfarm"))
    if not b.exists():
        subprocess.run(["cargo", "build", "-p", "phyfarm"], cwd=REPO, check=True)
    return b


@pytest.fixture(scope="session")
def kbuild_image() -> None:
    """The kbuild image, as a kernel build would get it (built if missing)."""
    if shutil.which("podman") is None:
        pytest.skip("podman is not installed (run containers/host-setup.sh)")
    p = subprocess.run(
        [str(binary()), "images", "--only", "kbuild"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=3600,
        check=False,
    )
    assert p.returncode == 0, f"cannot build the kbuild image:\n{p.stderr[-3000:]}"


@pytest.fixture
def make(kbuild_image, tmp_path: Path):
    def run(makefile: str, env: dict[str, str] | None = None, files: dict | None = None) -> Made:
        tree = tmp_path / "tree"
        tree.mkdir(exist_ok=True)
        (tree / "Makefile").write_text(makefile)
        for name, text in (files or {}).items():
            (tree / name).write_text(text)
        out = tmp_path / "out"
        t = time.monotonic()
        p = subprocess.run(
            [str(binary()), "sandbox-make", "--tree", str(tree), "-o", str(out)],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
            env={**os.environ, **(env or {})},
        )
        return Made(p.returncode, p.stdout, p.stderr, time.monotonic() - t, tree, out)

    return run


#: The recipe lines that leave what a kernel build leaves.
LEAVE_ARTIFACTS = (
    "\tmkdir -p arch/x86/boot\n"
    "\techo kernel > arch/x86/boot/bzImage\n"
    "\techo CONFIG_X=y > .config\n"
    "\techo map > System.map\n"
)
ARTIFACTS = "all:\n" + LEAVE_ARTIFACTS


def test_a_plain_build_passes_and_runs_in_the_sandbox(make):
    m = make(ARTIFACTS)
    assert m.code == 0, m.describe()
    assert (m.out / "bzImage").read_text() == "kernel\n"
    assert (m.out / ".config").exists() and (m.out / "System.map").exists()
    cmd = next(line for line in m.log.splitlines() if line.startswith("$ podman run"))
    for flag in (
        "--network=none",
        "--cap-drop=all",
        "--security-opt=no-new-privileges",
        "--read-only",
    ):
        assert flag in cmd, cmd
    assert "# sandbox:" in m.log, "the log says which sandbox ran"


def test_a_symlinked_bzimage_is_not_copied(make, tmp_path):
    secret = tmp_path / "runner-home" / ".pgpass"
    secret.parent.mkdir()
    secret.write_text(f"localhost:5432:phyfarm:ci:{SECRET}\n")
    m = make(
        ARTIFACTS.replace(
            "echo kernel > arch/x86/boot/bzImage", f"ln -sf {secret} arch/x86/boot/bzImage"
        )
    )
    assert m.code == 1, m.describe()
    assert "refused to copy an artifact" in m.stderr, m.describe()
    assert "arch/x86/boot/bzImage" in m.stderr and "symbolic link" in m.stderr, m.describe()
    assert not (m.out / "bzImage").exists()
    for f in m.out.rglob("*"):
        if f.is_file():
            assert SECRET not in f.read_text(errors="replace"), f
    assert SECRET not in m.stdout + m.stderr


def test_the_network_is_not_reachable(make):
    m = make(
        "all:\n"
        "\tcat /proc/net/dev > /build/netdev\n"
        "\tpython3 -c \"import socket; socket.create_connection(('1.1.1.1', 53), timeout=5)\""
        " && touch /build/NET-REACHED\n"
    )
    assert m.code == 1, m.describe()
    assert "make exited" in m.stderr, m.describe()
    assert not (m.tree / "NET-REACHED").exists()
    ifaces = [
        line.split(":")[0].strip()
        for line in (m.tree / "netdev").read_text().splitlines()[2:]
        if ":" in line
    ]
    assert ifaces == ["lo"], ifaces


def test_filling_the_disk_is_stopped_at_the_budget(make):
    m = make(
        "all:\n\tdd if=/dev/zero of=/build/fill bs=1M count=20000 status=none\n",
        env={"PHYFARM_BUILD_DISK": "200m"},
    )
    try:
        assert m.code == 1, m.describe()
        assert "PHYFARM_BUILD_DISK" in m.stderr, m.describe()
        assert re.search(r"wrote more than 209 MB into \S+", m.stderr), m.describe()
        size = (m.tree / "fill").stat().st_size if (m.tree / "fill").exists() else 0
        assert size < 20000 << 20, "dd ran to its end"
    finally:
        (m.tree / "fill").unlink(missing_ok=True)


FORK = """\
import os, time
n = 0
for _ in range(2000):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        time.sleep(120)
        os._exit(0)
    n += 1
open("/build/spawned", "w").write(str(n))
"""


def test_a_fork_bomb_hits_the_pids_limit(make):
    m = make(
        "all:\n\tpython3 fork.py\n" + LEAVE_ARTIFACTS,
        env={"PHYFARM_BUILD_PIDS": "64"},
        files={"fork.py": FORK},
    )
    if "no pids limit" in m.log:
        pytest.skip("this host cannot apply a pids limit (see the build log's sandbox line)")
    assert m.code == 0, m.describe()
    assert "--pids-limit=64" in m.log, m.describe()
    spawned = int((m.tree / "spawned").read_text())
    assert 0 < spawned < 64, f"spawned {spawned} processes"
    assert m.seconds < 120, "the build outlived its forks"


def test_a_build_that_never_ends_is_stopped_and_says_why(make):
    m = make("all:\n\tsleep 100000\n", env={"PHYFARM_BUILD_TIMEOUT": "5"})
    assert m.code == 1, m.describe()
    assert "timed out after 5s (PHYFARM_BUILD_TIMEOUT)" in m.stderr, m.describe()
    assert "phyfarm stopped this step: timed out" in m.log
    assert m.seconds < 90, m.describe()
    ps = subprocess.run(
        ["podman", "ps", "--format", "{{.Command}}"],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "CONTAINERS_CONF": str(REPO / "containers/containers.conf")},
    )
    assert "sleep 100000" not in ps.stdout, "the container outlived its timeout"


OUTSIDE = (
    """\
all:
\tfor p in /etc/phyfarm-x /usr/phyfarm-x /phyfarm-x /root/phyfarm-x /var/phyfarm-x; do \\
\t  if touch $$p 2>/dev/null; then echo "WROTE $$p"; else echo "refused $$p"; fi; \\
\tdone > /build/report
\tgrep -E '^(CapEff|CapPrm|NoNewPrivs):' /proc/self/status > /build/status
\tid -u > /build/uid
"""
    + LEAVE_ARTIFACTS
)


def test_writes_outside_the_tree_are_refused(make):
    m = make(OUTSIDE)
    assert m.code == 0, m.describe()
    report = (m.tree / "report").read_text()
    assert "WROTE" not in report, report
    assert report.count("refused") == 5, report
    status = dict(line.split(":", 1) for line in (m.tree / "status").read_text().splitlines())
    assert int(status["CapEff"], 16) == 0 and int(status["CapPrm"], 16) == 0, status
    assert status["NoNewPrivs"].strip() == "1", status
    for p in ("/etc/phyfarm-x", "/usr/phyfarm-x", "/phyfarm-x", "/root/phyfarm-x"):
        assert not Path(p).exists()


def test_the_build_runs_as_an_unprivileged_host_user(make):
    m = make(OUTSIDE)
    if "no user namespace" in m.log:
        pytest.skip("this host has no user namespaces for podman (see the build log)")
    assert f"--uidmap=0:{UID_BASE}:" in m.log, m.describe()
    assert (m.tree / "uid").read_text().strip() == "0", "root inside the container"
    assert (m.tree / "uid").stat().st_uid == UID_BASE, "but not on the host"


def test_the_memory_limit_is_applied(make):
    m = make(
        "all:\n\tcat /sys/fs/cgroup/memory.max /sys/fs/cgroup/memory/memory.limit_in_bytes"
        " 2>/dev/null > /build/limit; true\n" + LEAVE_ARTIFACTS,
        env={"PHYFARM_BUILD_MEMORY": "512m"},
    )
    if "no memory limit" in m.log:
        pytest.skip("this host cannot apply a memory limit (see the build log's sandbox line)")
    assert m.code == 0, m.describe()
    assert "--memory=512m" in m.log, m.describe()
    assert (m.tree / "limit").read_text().split()[0] == str(512 << 20)
