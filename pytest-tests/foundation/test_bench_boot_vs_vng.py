"""bench/boot-vs-vng refuses to compare against a reference that cannot run:
exit 2, the reason on the last E: line, and never a ratio. (No timing is
asserted; these runs stop before any guest boots.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO

BENCH = REPO / "bench/boot-vs-vng.py"


def script(path: Path, body: str) -> Path:
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)
    return path


def kernel(d: Path, version: str, config: str) -> Path:
    d.mkdir(parents=True)
    (d / "bzImage").write_bytes(b"not a kernel")
    (d / ".config").write_text(config)
    meta = {"variant": "rust", "kernel_package": "linux-source-6.12", "kernel_version": version}
    (d / "metadata.json").write_text(json.dumps(meta))
    return d / "bzImage"


@pytest.fixture
def host(tmp_path):
    """A PATH with a stand-in QEMU, a stand-in vng and its virtme-run."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script(bin_dir / "qemu-system-x86_64", 'echo "QEMU emulator version 7.2.22"')
    vng = script(bin_dir / "vng", 'echo "virtme-ng 1.42"')
    script(bin_dir / "virtme-run", "exit 0")
    # The .config lines a build from this checkout's fragments holds, and
    # the vng kernel's with bench/vng.config's options after them.
    fragments = [REPO / "pipeline/kconfig" / f for f in ("phyfarm.config", "variant-rust.config")]
    ours = "".join(config_lines(f) for f in fragments)
    full = ours + config_lines(REPO / "bench/vng.config")
    return {"tmp": tmp_path, "bin": bin_dir, "vng": vng, "config": ours, "full_config": full}


def config_lines(path: Path) -> str:
    return "".join(
        line + "\n"
        for line in path.read_text().splitlines()
        if line.startswith("CONFIG_") or (line.startswith("# CONFIG_") and "is not set" in line)
    )


def bench(host, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PATH"] = f"{host['bin']}{os.pathsep}{env.get('PATH', '')}"
    env["PHYFARM_CACHE"] = str(host["tmp"] / "cache")
    env["PHYFARM_BIN"] = "/bin/true"
    # What bench/boot-vs-vng.sh does, with this Python (the cache is a test's).
    env["PYTHONPATH"] = str(REPO / "harness")
    argv = [sys.executable, str(BENCH), "--accel", "tcg", *args]
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60, cwd=REPO)


def refused(r: subprocess.CompletedProcess, reason: str) -> None:
    assert r.returncode == 2, r.stderr
    assert "ratio" not in r.stdout, r.stdout
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("E: ") and reason in last, r.stderr


def test_no_vng_is_exit_2(host):
    r = bench(host, "--vng", str(host["tmp"] / "nowhere/vng"))
    refused(r, "vng (virtme-ng) is not installed")


def test_a_phyfarm_kernel_built_before_a_fragment_changed_is_exit_2(host):
    """The kernel timed must boot as the farm's does: one whose .config does
    not hold what the fragments now ask is refused, the option named."""
    config = host["config"].replace("# CONFIG_LEGACY_PTYS is not set\n", "CONFIG_LEGACY_PTYS=y\n")
    assert config != host["config"]
    pk = kernel(host["tmp"] / "rust", "6.12.118-1", config)
    r = bench(host, "--vng", str(host["vng"]), "--kernel", str(pk))
    refused(r, "is not configured as phyfarm's fragments ask (# CONFIG_LEGACY_PTYS is not set)")


def test_no_vng_kernel_is_exit_2(host):
    pk = kernel(host["tmp"] / "rust", "6.12.118-1", host["config"])
    r = bench(host, "--vng", str(host["vng"]), "--kernel", str(pk))
    refused(r, "no kernel for the vng reference")


def test_a_kernel_without_virtme_ngs_options_is_exit_2(host):
    pk = kernel(host["tmp"] / "rust", "6.12.118-1", host["config"])
    config = host["full_config"].replace("CONFIG_9P_FS=y\n", "")
    vk = kernel(host["tmp"] / "vng", "6.12.118-1", config)
    r = bench(host, "--vng", str(host["vng"]), "--kernel", str(pk), "--vng-kernel", str(vk))
    refused(r, "not configured as phyfarm's fragments and bench/vng.config ask (CONFIG_9P_FS=y)")


def test_kernels_from_different_sources_are_exit_2(host):
    pk = kernel(host["tmp"] / "rust", "6.12.118-1", host["config"])
    vk = kernel(host["tmp"] / "vng", "6.12.99-1", host["full_config"])
    r = bench(host, "--vng", str(host["vng"]), "--kernel", str(pk), "--vng-kernel", str(vk))
    refused(r, "not from the same distro source")


def test_fewer_than_five_rounds_is_a_usage_error(host):
    r = bench(host, "--repeat", "3")
    assert r.returncode == 2 and "--repeat must be >= 5" in r.stderr
