"""In-guest TCP throughput through the emulated AX88772A, as ratios.

One invocation boots three guests from the same kernel, each with the same
partner virtio NIC in its own network namespace:

  paced    ax88772-emu pacing frames to the negotiated 100 Mbit/s
  unpaced  ax88772-emu --unpaced
  usb-net  QEMU's built-in usb-net (CDC-ECM) on qemu-xhci, the reference

and runs the same iperf3 TCP tests in each (DUT->partner and partner->DUT,
--seconds each, --repeat rounds interleaved across the guests, median), with
TCP timestamps off unless --timestamps. Under TCG the guests are told the
host's TSC rate (a guest whose calibration fails keeps time with jiffies,
which run slow on a loaded host), and every rate is converted to host time
with the guest clock's rate measured around each run. It prints Mbit/s and
two ratios, each against a reference of this invocation:

  paced / 100BASE-TX TCP goodput (94.9 Mbit/s)   target >= 0.99
  unpaced / usb-net                              target >= 0.8

Nothing is asserted. Exit status: 0 the benchmark ran (targets met or not),
2 it could not run (the reason is the last E: line). Progress goes to stderr
as I:/W:/E: lines; the table to stdout; one output folder keeps
results.json and each guest's console and logs, named on the last line.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from phyfarm_farm import procs
from phyfarm_farm.emulator import Emulator
from phyfarm_farm.errors import FarmError
from phyfarm_farm.farm import NETNS, Farm, tcp_goodput_ratio
from phyfarm_farm.guest import (
    Guest,
    GuestConfig,
    cache_dir,
    host_tsc_khz,
    phyfarm_binary,
    qemu_version,
)

REPO = Path(__file__).resolve().parent.parent
LINE_MBPS = 100.0
PACED_TARGET = 0.99
UNPACED_TARGET = 0.8
DIRECTIONS = (("tx", "DUT->partner", False), ("rx", "partner->DUT", True))


class CannotRun(Exception):
    """The benchmark could not be completed (exit 2)."""


def log(level: str, msg: str) -> None:
    print(f"{level}: {msg}", file=sys.stderr, flush=True)


def tcp_goodput_mbps(timestamps: bool) -> float:
    """Most TCP payload a 100 Mbit/s link carries (the farm's rule)."""
    return LINE_MBPS * tcp_goodput_ratio(timestamps)


# -- what the run needs ------------------------------------------------------
def run_tool(argv: list[str], what: str, timeout: float = 1800) -> str:
    env = dict(os.environ)
    env.setdefault("CARGO_BUILD_JOBS", "1")
    try:
        p = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise CannotRun(f"{what}: {e}") from e
    if p.returncode != 0:
        raise CannotRun(f"{what} failed ({p.returncode}): {' '.join(argv)}\n{p.stderr[-2000:]}")
    return p.stdout


def check_kernel(kernel: Path) -> dict:
    """The kernel exists and (when its .config is beside it) has both drivers."""
    if not kernel.is_file():
        raise CannotRun(f"no kernel {kernel} (phyfarm build --variant rust, or --kernel)")
    meta = {}
    with contextlib.suppress(OSError, ValueError):
        meta = json.loads((kernel.parent / "metadata.json").read_text())
    config = kernel.parent / ".config"
    if config.is_file():
        text = config.read_text(errors="replace")
        for opt in ("CONFIG_USB_NET_AX8817X", "CONFIG_USB_NET_CDCETHER"):
            if f"{opt}=y" not in text:
                raise CannotRun(
                    f"{kernel} lacks {opt}=y, which the comparison needs: "
                    f"phyfarm build --variant rust -K {opt}=y -o DIR, then --kernel DIR/bzImage"
                )
    else:
        log("W", f"no .config beside {kernel}; assuming asix and cdc_ether are built in")
    return {
        "path": str(kernel),
        "variant": meta.get("variant"),
        "kernel_version": meta.get("kernel_version"),
        "config_hash": meta.get("config_hash"),
    }


def resolve_accel(want: str) -> tuple[str, str]:
    """auto: the farm's cached KVM probe for this host boot, else whether /dev/kvm opens."""
    if want != "auto":
        return want, "requested"
    try:
        os.close(os.open("/dev/kvm", os.O_RDWR))
    except OSError as e:
        return "tcg", f"no usable KVM device (/dev/kvm: {e.strerror})"
    with contextlib.suppress(OSError, ValueError):
        rec = json.loads((cache_dir() / "accel-probe.json").read_text())
        boot_id = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        if rec.get("boot_id") == boot_id:
            return ("kvm" if rec.get("kvm_usable") else "tcg"), f"KVM probe: {rec.get('reason')}"
    return "kvm", "/dev/kvm opens (no KVM probe for this boot; --accel tcg to override)"


# -- one guest per configuration -----------------------------------------------
@dataclass
class Config:
    key: str
    title: str
    emulator_args: list[str] | None  # None: QEMU's usb-net instead of the emulator
    farm: Farm | None = None
    sockdir: Path | None = None
    runs: dict = field(default_factory=lambda: {"tx": [], "rx": []})
    retransmits: dict = field(default_factory=lambda: {"tx": [], "rx": []})
    #: Guest seconds per host second, one per run (1.0: the guest keeps time).
    clock_rates: list = field(default_factory=list)
    clocksource: str = ""

    def median(self, d: str) -> float | None:
        return statistics.median(self.runs[d]) if self.runs[d] else None


CONFIGS = (
    ("paced", "emulator, paced", []),
    ("unpaced", "emulator, --unpaced", ["--unpaced"]),
    ("usbnet", "QEMU usb-net on xHCI", None),
)


def boot(c: Config, args, kernel: Path, image: Path, emulator: Path, out: Path) -> None:
    logdir = out / c.key
    logdir.mkdir(parents=True)
    c.sockdir = Path(tempfile.mkdtemp(prefix="phyfarm-bench-", dir="/tmp"))
    emu = None
    if c.emulator_args is not None:
        emu = Emulator(emulator, c.sockdir, logdir, ["--quiet", *c.emulator_args])
        emu.start(timeout=30)
        usb, usb_net = ("unix", emu.usb_sock), False
        wire = (emu.partner_wire, emu.emu_wire)
    else:
        usb, usb_net, wire = None, True, None
    cfg = GuestConfig(
        kernel=kernel,
        initrd=image,
        accel=args.accel,
        timeout=args.guest_timeout,
        usb=usb,
        usb_net=usb_net,
        wire=wire,
        append=args.append,
        tsc_khz=args.tsc_khz,
    )
    guest = Guest(cfg, c.sockdir, logdir)
    driver = "asix" if emu is not None else "cdc_ether"
    c.farm = Farm(guest=guest, emu=emu, variant="", accel=args.accel, dut_driver=driver)
    guest.start()
    c.farm.find_interfaces(timeout=min(args.guest_timeout, 60))
    c.farm.setup_network(carrier_timeout=30)
    c.farm.set_tcp_timestamps(args.timestamps)
    c.farm.start_iperf_server()
    speed = c.farm.link_state().get("speed", "?")
    c.clocksource = guest.read("/sys/devices/system/clocksource/clocksource0/current_clocksource")
    log(
        "I",
        f"{c.key}: booted in {guest.boot_seconds:.1f}s, {c.farm.dut} ({driver}, {speed} Mbit/s)"
        f" <-> {c.farm.partner_nic} in netns {NETNS}; guest clocksource {c.clocksource}",
    )


def stop(c: Config) -> None:
    if c.farm is not None:
        if c.farm.emu is not None:
            with contextlib.suppress(Exception):
                snap = {"phy": c.farm.emu.phy().get("phy"), "counters": c.farm.emu.counters()}
                (c.farm.guest.logdir / "emulator-final.json").write_text(json.dumps(snap, indent=2))
        c.farm.guest.stop()
        if c.farm.emu is not None:
            c.farm.emu.stop()
    if c.sockdir is not None:
        shutil.rmtree(c.sockdir, ignore_errors=True)


def measure(c: Config, d: str, reverse: bool, args) -> float:
    """One iperf3 run of --omit + --seconds; the goodput the receiver counted
    over the last --seconds, Mbit/s in host time (Farm.tcp_goodput, as the
    farm's throughput check measures: the guest clock's rate around the run
    is measured, so guests with different clocks compare fairly)."""
    assert c.farm is not None
    g = c.farm.tcp_goodput(seconds=args.seconds + args.omit, reverse=reverse, skip=args.omit)
    c.runs[d].append(g.mbps)
    c.clock_rates.append(g.clock)
    if g.retransmits is not None:
        c.retransmits[d].append(g.retransmits)
    return g.mbps


# -- report --------------------------------------------------------------------
def fmt(x: float | None, spec: str = ".1f") -> str:
    return "-" if x is None else format(x, spec)


def verdict(ratio: float | None, target: float) -> str:
    if ratio is None:
        return "n/a"
    return "met" if ratio >= target else "NOT met"


def report(configs: dict[str, Config], goodput: float, args) -> dict:
    lines = [
        f"TCP goodput, Mbit/s in host time (median of {args.repeat} x {args.seconds}s, "
        f"first {args.omit}s omitted, accel {args.accel}):",
        f"  {'configuration':24} {'DUT->partner':>13} {'partner->DUT':>13}  guest clock",
    ]
    for c in configs.values():
        clock = statistics.median(c.clock_rates) if c.clock_rates else None
        lines.append(
            f"  {c.title:24} {fmt(c.median('tx')):>13} {fmt(c.median('rx')):>13}"
            f"  {c.clocksource or '?'} x{fmt(clock, '.3f')}"
        )
    lines += ["", f"  {'ratio':34} {'DUT->partner':>13} {'partner->DUT':>13}  target"]
    ratios: dict[str, dict] = {}
    rows = (
        ("paced", f"paced / {goodput:.1f} (100BASE-TX)", PACED_TARGET),
        ("unpaced", "unpaced / usb-net", UNPACED_TARGET),
    )
    for key, title, target in rows:
        r = {}
        for d, _, _ in DIRECTIONS:
            num = configs[key].median(d)
            den = goodput if key == "paced" else configs["usbnet"].median(d)
            r[d] = num / den if num is not None and den else None
        ratios[key] = {
            "target": target,
            **{d: {"ratio": r[d], "verdict": verdict(r[d], target)} for d in r},
        }
        cells = [f"{fmt(r[d], '.3f')} {verdict(r[d], target):>7}" for d, _, _ in DIRECTIONS]
        lines.append(f"  {title:34} {cells[0]:>13} {cells[1]:>13}  >= {target}")
    print("\n".join(lines), flush=True)
    return ratios


def write_json(path: Path, doc: dict) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(json.dumps(doc, indent=2) + "\n")
    tmp.replace(path)


# -- main ----------------------------------------------------------------------
def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="bench/guest-throughput.sh",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n\n".join(__doc__.split("\n\n")[1:]),
    )
    p.add_argument("--seconds", type=int, default=10, help="length of one iperf3 test [10]")
    p.add_argument("--repeat", type=int, default=3, help="rounds; the median is reported [3]")
    p.add_argument(
        "--omit",
        type=int,
        default=2,
        help="seconds of ramp-up run first and left out (TCP under TCG ramps for about 2s) [2]",
    )
    p.add_argument(
        "--kernel",
        type=Path,
        help="guest kernel with asix and cdc_ether [<cache>/out/rust/bzImage]",
    )
    p.add_argument("--accel", choices=("auto", "kvm", "tcg"), default="auto", help="[auto]")
    p.add_argument("--emulator", type=Path, help="ax88772-emu [built: target/release]")
    p.add_argument("--guest-image", type=Path, help="farm initramfs [phyfarm guest image]")
    p.add_argument("--guest-timeout", type=float, default=120.0, help="boot/command timeout [120]")
    p.add_argument("--append", default="", help="extra guest kernel command line")
    p.add_argument(
        "--tsc-khz",
        default="auto",
        help="under TCG, the guest's TSC rate (tsc_early_khz=): auto (the host's, from "
        "/proc/cpuinfo), a number, or off (the guest calibrates; may fall back to jiffies) [auto]",
    )
    p.add_argument(
        "--timestamps",
        action="store_true",
        help="keep TCP timestamps (the line-rate reference becomes 94.1 Mbit/s)",
    )
    p.add_argument(
        "-o", "--out", type=Path, help="output folder [<cache>/bench/guest-throughput-*]"
    )
    a = p.parse_args(argv)
    if a.tsc_khz == "auto":
        a.tsc_khz = host_tsc_khz()
    elif a.tsc_khz == "off":
        a.tsc_khz = None
    elif a.tsc_khz.isdigit():
        a.tsc_khz = int(a.tsc_khz)
    else:
        p.error("--tsc-khz: auto, off or a number of kHz")
    if a.seconds < 1 or a.repeat < 1 or not 0 <= a.omit < 60:
        p.error("--seconds and --repeat must be >= 1, --omit in 0..59")
    return a


def prepare(args) -> tuple[Path, dict, Path, Path]:
    if shutil.which("qemu-system-x86_64") is None:
        raise CannotRun("qemu-system-x86_64 is not installed (bash containers/host-setup.sh)")
    kernel = (args.kernel or cache_dir() / "out/rust/bzImage").resolve()
    kinfo = check_kernel(kernel)
    emulator = args.emulator
    if emulator is None:
        run_tool(
            ["cargo", "build", "--quiet", "--release", "-p", "ax88772", "--bin", "ax88772-emu"],
            "cargo build --release -p ax88772",
        )
        emulator = REPO / "target/release/ax88772-emu"
    image = args.guest_image
    if image is None:
        phyfarm = phyfarm_binary()
        if not phyfarm.is_file():
            run_tool(["cargo", "build", "--quiet", "-p", "phyfarm"], "cargo build -p phyfarm")
        out = run_tool([str(phyfarm), "guest", "image"], "phyfarm guest image")
        image = Path(out.strip().splitlines()[-1])
    if not image.is_file():
        raise CannotRun(f"no guest image {image}")
    return kernel, kinfo, emulator.resolve(), image


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    procs.install_sigterm_handler()
    log("I", "bench/guest-throughput.sh " + " ".join(argv))
    stamp = time.strftime("%Y%m%dT%H%M%S")
    out = args.out or cache_dir() / "bench" / f"guest-throughput-{stamp}"
    configs = {k: Config(k, t, a) for k, t, a in CONFIGS}
    doc: dict = {"command": " ".join(["bench/guest-throughput.sh", *argv]), "status": "ERROR"}
    t0 = time.monotonic()
    try:
        kernel, kinfo, emulator, image = prepare(args)
        args.accel, why = resolve_accel(args.accel)
        qv = ".".join(map(str, qemu_version()))
        emu_v = run_tool([str(emulator), "--version"], "ax88772-emu --version").strip()
        log("I", f"kernel {kernel} ({kinfo.get('kernel_version')}), QEMU {qv}, {emu_v}")
        tsc = f", guest TSC {args.tsc_khz} kHz" if args.tsc_khz and args.accel == "tcg" else ""
        log("I", f"accel {args.accel} ({why}){tsc}; output in {out}")
        out.mkdir(parents=True, exist_ok=True)
        doc.update(
            kernel=kinfo,
            qemu=qv,
            emulator=emu_v,
            guest_image=str(image),
            accel=args.accel,
            accel_reason=why,
            seconds=args.seconds,
            repeat=args.repeat,
            omit=args.omit,
            tcp_timestamps=args.timestamps,
            guest_tsc_khz=args.tsc_khz if args.accel == "tcg" else None,
        )
        for c in configs.values():
            log("I", f"{c.key}: booting ({c.title})")
            boot(c, args, kernel, image, emulator, out)
        boot_s = time.monotonic() - t0
        # Rounds interleave the guests, so load drifting on the host hits all three alike.
        for rnd in range(1, args.repeat + 1):
            for c in configs.values():
                for d, label, reverse in DIRECTIONS:
                    rate = measure(c, d, reverse, args)
                    log("I", f"round {rnd}/{args.repeat} {c.key} {label}: {rate:.1f} Mbit/s")
        for c in configs.values():
            assert c.farm is not None
            for s in c.farm.guest.splats():
                log("W", f"{c.key}: guest kernel {s.what} (console: {c.farm.guest.console})")
    except (CannotRun, FarmError, OSError) as e:
        log("E", f"could not run the benchmark: {e}")
        doc["error"] = str(e)
        if out.is_dir():
            write_json(out / "results.json", doc)
            log("I", f"output: {out}")
        return 2
    finally:
        for c in configs.values():
            stop(c)
    goodput = tcp_goodput_mbps(args.timestamps)
    ratios = report(configs, goodput, args)
    doc.update(
        status="DONE",
        line_goodput_mbps=goodput,
        results={
            c.key: {
                "title": c.title,
                "clocksource": c.clocksource,
                "guest_clock_rates": c.clock_rates,
                **{
                    d: {
                        "median_mbps": c.median(d),
                        "runs_mbps": c.runs[d],
                        "retransmits": c.retransmits[d],
                    }
                    for d, _, _ in DIRECTIONS
                },
            }
            for c in configs.values()
        },
        ratios=ratios,
        durations={"boot": boot_s, "total": time.monotonic() - t0},
    )
    write_json(out / "results.json", doc)
    log("I", f"phases: boot {boot_s:.0f}s, total {time.monotonic() - t0:.0f}s")
    log("I", f"output: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
