"""A results store for the dashboard tests, recorded with `phyfarm store import`.

It holds the shipped series' v7 and v8 (pipeline/tests/fixtures/results), a
second series with three revisions whose throughput and link-flap timings
move across revisions (so the trend charts have something to show), and a
hostile series whose subject, author, file name and console log try to
inject markup and terminal escapes.
"""

from __future__ import annotations

import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SHIPPED = REPO / "pipeline/tests/fixtures/results"
NOW = "2026-06-16T00:00:00Z"
BASE = "linux-source-6.12 6.12.38-1"
SCRIPT = "<script>alert(1)</script>"

ENV = {
    "accelerator": "tcg",
    "host": "runner-1",
    "arch": "x86_64",
    "images": {
        "localhost/phyfarm-kbuild": "3f2a9c1d0b7e",
        "localhost/phyfarm-farm": "8c1e22aa4f90",
    },
    "tools": {
        "rustc": "1.85.0",
        "bindgen": "0.71.1",
        "gcc": "14.2.0",
        "qemu": "10.0.2",
        "linux-source-6.12": "6.12.38-1",
    },
}

FARM = [
    "farm.probe.ids",
    "farm.probe.phy_driver",
    "farm.link_flap.flap10",
    "farm.cable_test.not_supported",
    "farm.dmesg.clean",
]


def _measure(name: str, variant: str, unit: str, samples: list[float], lower: bool) -> dict:
    return {
        "name": name,
        "variant": variant,
        "value": sum(samples) / len(samples),
        "unit": unit,
        "samples": samples,
        "lower_is_better": lower,
    }


def _measurements(tx: float, rx: float, detect: float, recover: float, spread: float) -> list:
    out = []
    for variant, k in (("rust", 1.0), ("c", 1.004)):
        s = [-1.0, 0.0, 1.0, 0.5, -0.5]
        out += [
            _measure(
                "farm.throughput.tcp_tx",
                variant,
                "bit/s",
                [tx * k * (1 + spread * x) for x in s],
                False,
            ),
            _measure(
                "farm.throughput.tcp_rx",
                variant,
                "bit/s",
                [rx * k * (1 + spread * x) for x in s],
                False,
            ),
            _measure(
                "farm.link_flap.detect_ms",
                variant,
                "ms",
                [detect * k * (1 + 4 * spread * x) for x in s],
                True,
            ),
            _measure(
                "farm.link_flap.recover_ms",
                variant,
                "ms",
                [recover * k * (1 + 4 * spread * x) for x in s],
                True,
            ),
        ]
    return out


def _tests(fail: dict[tuple[str, str], str] | None = None) -> list:
    fail = fail or {}
    out = [{"path": f"apply.patch{n}", "status": "PASS"} for n in (1, 2, 3)]
    out += [
        {"path": "gate.rustfmtcheck", "status": "PASS"},
        {"path": "gate.clippy", "status": "PASS"},
    ]
    for variant in ("rust", "c"):
        for path in FARM:
            log = fail.get((path, variant))
            out.append(
                {
                    "path": path,
                    "variant": variant,
                    "status": "FAIL" if log else "PASS",
                    "duration_s": 14.0 if "flap" in path else 7.5,
                    "log_path": f"farm/{variant}/{path}.log",
                    "log_excerpt": log or "",
                }
            )
    return out


def _builds(patches: int, warnings: dict[tuple[str, int], list[str]] | None = None) -> list:
    warnings = warnings or {}
    out = []
    for variant in ("rust", "c"):
        out.append(
            {
                "patch": None,
                "variant": variant,
                "status": "PASS",
                "duration_s": 612.0,
                "warnings": 3,
                "log_path": f"build/{variant}/base.log",
            }
        )
        for n in range(1, patches + 1):
            new = warnings.get((variant, n), [])
            out.append(
                {
                    "patch": n,
                    "variant": variant,
                    "status": "PASS",
                    "duration_s": 88.0 + 7 * n,
                    "warnings": 3 + len(new),
                    "new_warnings": new,
                    "log_path": f"build/{variant}/patch{n}.log",
                }
            )
    return out


SUBJECTS = [
    "net: phy: ax88796b_rust: soft-reset the PHY after link loss",
    "rust: net::phy: add Device::genphy_soft_reset()",
    "net: phy: ax88796b_rust: read LPA only after autonegotiation completes",
]


def _revision(version: int, hash_char: str) -> dict:
    return {
        "series": "ax88772a-link-recovery",
        "version": version,
        "change_id": "20260601-ax88772a-link-recovery-0a1b2c3d4e5f",
        "tree": "net-next",
        "message_id": f"20260601-ax88772a-link-recovery-v{version}-0-0a1b@example.org",
        "patchset_hash": hash_char * 64,
        "patches": [
            {
                "position": i + 1,
                "subject": subject,
                "author": "FUJITA Tomonori",
                "author_email": "fujita.tomonori@gmail.com",
                "message_id": (
                    f"20260601-ax88772a-link-recovery-v{version}-{i + 1}-0a1b@example.org"
                ),
                "patch_id": f"{version}{i + 1}" + "c" * 38,
                "file": f"000{i + 1}-" + subject.split(": ")[-1].replace(" ", "-")[:40] + ".patch",
            }
            for i, subject in enumerate(SUBJECTS)
        ],
    }


OOPS_LOG = (
    "[    4.512] asix 1-1:1.0 eth0: link up, 100Mbps, full-duplex, lpa 0x0000\n"
    "[    5.020] ------------[ cut here ]------------\n"
    "[    5.020] WARNING: CPU: 0 PID: 41 at drivers/net/phy/phy.c:1254 phy_error+0x2a/0x60\n"
    "[    5.021] Call Trace:\n"
    "[    5.021]  <TASK>\n"
    "[    5.022]  phy_state_machine+0x8c/0x2d0\n"
    "link-flap: carrier transition 3 not seen within 5 s"
)


def runs() -> list[dict]:
    extra_base = {
        "schema": 1,
        "id": "20260609T080000Z-base-0",
        "revision": None,
        "base": BASE,
        "environment": ENV,
        "started": "2026-06-09T08:00:00Z",
        "finished": "2026-06-09T08:41:00Z",
        "reproducer": "phyfarm run --base-only",
        "builds": _builds(0),
        "tests": _tests(),
        "measurements": _measurements(94.1e6, 94.6e6, 180.0, 920.0, 0.002),
    }
    series = []
    plan = [
        # version, created, tx, rx, detect, recover, failing checks, new warnings
        (
            1,
            "2026-06-10T09:00:00Z",
            88.2e6,
            90.1e6,
            410.0,
            1480.0,
            {("farm.link_flap.flap10", "rust"): OOPS_LOG},
            {},
        ),
        (
            2,
            "2026-06-12T14:00:00Z",
            93.9e6,
            94.4e6,
            240.0,
            1010.0,
            {},
            {
                ("rust", 2): [
                    "rust/kernel/net/phy.rs:402:9: warning: unused variable: `ret`",
                ]
            },
        ),
        (3, "2026-06-14T18:00:00Z", 94.2e6, 94.7e6, 170.0, 880.0, {}, {}),
    ]
    for version, started, tx, rx, detect, recover, fail, warns in plan:
        day, _ = started.split("T")
        series.append(
            {
                "schema": 1,
                "id": f"{day.replace('-', '')}T{started[11:13]}0000Z-lr-v{version}",
                "revision": _revision(version, "abc"[version - 1]),
                "base": BASE,
                "environment": ENV,
                "started": started,
                "finished": started[:11] + f"{int(started[11:13]) + 1:02d}" + started[13:],
                "reproducer": f"phyfarm run patches/ax88772a-link-recovery/v{version}",
                "builds": _builds(3, warns),
                "tests": _tests(fail),
                "measurements": _measurements(tx, rx, detect, recover, 0.001),
            }
        )
    evil = {
        "schema": 1,
        "id": "20260613T100000Z-evil-1",
        "revision": {
            "series": "evil",
            "version": 1,
            "change_id": "20260613-evil-0000",
            "tree": "net-next",
            "message_id": "evil-0@example.org",
            "patchset_hash": "e" * 64,
            "patches": [
                {
                    "position": 1,
                    "subject": SCRIPT,
                    "author": '"><img src=x onerror=alert(3)>',
                    "author_email": "evil@example.org",
                    "message_id": "evil-1@example.org",
                    "patch_id": "0" * 40,
                    "file": "0001-<b>bold</b>.patch",
                }
            ],
        },
        "base": BASE,
        "environment": ENV,
        "started": "2026-06-13T10:00:00Z",
        "finished": "2026-06-13T10:30:00Z",
        "reproducer": "phyfarm run 'patches/evil/v1' \x1b[31m<script>alert(4)</script>",
        "builds": [],
        "tests": [
            {
                "path": "farm.dmesg.clean",
                "variant": "rust",
                "status": "FAIL",
                "duration_s": 9.0,
                "log_excerpt": (
                    "\x1b[1;31m[   3.100] BUG: kernel NULL pointer dereference\x1b[0m\n"
                    "\x1b]0;pwned\x07\x1b[2J[   3.101] RIP: phy_attach "
                    "<img src=x onerror=alert(2)>\n"
                    "\x1b[32m<script>alert(5)</script>\x1b[0m\n" * 40
                ),
            }
        ],
        "measurements": [],
    }
    return [extra_base, *series, evil]


def build(phyfarm, directory: Path) -> Path:
    """Record every fixture run into directory/results.sqlite."""
    store = directory / "results.sqlite"
    files = [SHIPPED / n for n in ("base.json", "v7.json", "v8.json")]
    for i, run in enumerate(runs()):
        f = directory / f"run{i}.json"
        f.write_text(json.dumps(run, indent=1))
        files.append(f)
    r = phyfarm("--store", str(store), "store", "import", *map(str, files))
    assert r.code == 0, r.describe()
    return store
