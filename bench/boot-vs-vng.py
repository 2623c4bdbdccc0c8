"""Boot to a guest ready for checks: phyfarm's farm guest against virtme-ng.

One invocation times, alternating the two (the order swaps every round, so
load drifting on the host hits both alike), --repeat rounds of each:

  phyfarm  what the farm does before every check (phyfarm_farm's boot_farm):
           start ax88772-emu, start QEMU with the farm initramfs, wait for
           the guest agent, find the AX88772A and the partner NIC, bring the
           link up and wait for carrier. Timed from the emulator's start (it
           precedes QEMU) to carrier.
  vng      `vng --run <bzImage> --disable-kvm --exec true` (virtme-ng, pinned
           in pytest-tests/requirements.txt; --disable-kvm only under TCG),
           timed from its start to its exit: boot the host's root
           filesystem, run `true`, power off.

Both kernels come from the same distro source through `phyfarm build`:
phyfarm's own rust variant (<cache>/out/rust) and the same variant with the
options virtme-ng needs (bench/vng.config, built as a -K variant into
<cache>/out/vng), each checked against this checkout's fragments (a kernel
built before a fragment changed is refused, or rebuilt with --build). Both
run the same QEMU binary (the host's, found on PATH;
the farm runs QEMU on the host too, the farm image only supplies the guest's
user space) under the same accelerator: `auto` takes phyfarm's KVM probe for
this host boot (running it if needed), else TCG. The accelerator and the
QEMU binary each side actually ran are read from its QEMU process and
printed. It prints both medians and the ratio phyfarm / vng (target <= 0.3).
One warm-up run of each comes first and is not counted.

Nothing is asserted. Exit status: 0 the benchmark ran (target met or not),
2 it could not run, the reference included (no vng, no QEMU, a kernel
missing or lacking virtme-ng's options, vng failing): the reason is the last
E: line, and no ratio is printed. Progress goes to stderr as I:/W:/E: lines,
the table to stdout; the output folder (named on the last line) keeps
results.json and every run's logs.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
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
from phyfarm_farm.farm import Farm
from phyfarm_farm.guest import Guest, GuestConfig, cache_dir, host_tsc_khz, phyfarm_binary

REPO = Path(__file__).resolve().parent.parent

TARGET = 0.3
MIN_REPEAT = 5
VNG_CONFIG = REPO / "bench" / "vng.config"
#: What `phyfarm build --variant rust` applies, in its order.
FRAGMENTS = [REPO / "pipeline/kconfig" / f for f in ("phyfarm.config", "variant-rust.config")]
#: One kernel build at a time on a host: every build this bench starts takes it.
BUILD_LOCK = Path("/tmp/phyfarm-kernel-build.lock")


class CannotRun(Exception):
    """The benchmark could not be completed (exit 2)."""


def log(level: str, msg: str) -> None:
    print(f"{level}: {msg}", file=sys.stderr, flush=True)


def phyfarm_bin() -> Path:
    return phyfarm_binary()


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


# -- the kernels ---------------------------------------------------------------
def vng_options() -> list[str]:
    """bench/vng.config: the CONFIG_X=y lines virtme-ng needs."""
    lines = VNG_CONFIG.read_text().splitlines()
    return [x.strip() for x in lines if x.strip() and not x.lstrip().startswith("#")]


def build_argv(out: Path, vng: bool) -> list[str]:
    argv = [str(phyfarm_bin()), "build", "--variant", "rust"]
    if vng:
        for opt in vng_options():
            argv += ["-K", opt]
    return [*argv, "-o", str(out)]


def config_lines(lines: list[str]) -> dict[str, str]:
    """CONFIG_X=v and "# CONFIG_X is not set" (as "n") lines, by option."""
    out = {}
    for raw in lines:
        line = raw.strip()
        if line.startswith("CONFIG_") and "=" in line:
            name, value = line.split("=", 1)
            out[name] = value
        elif line.startswith("# CONFIG_") and line.endswith(" is not set"):
            out[line[2 : -len(" is not set")]] = "n"
    return out


def wanted_config(vng: bool) -> dict[str, str]:
    """What the kernel's .config must hold: phyfarm's fragments for the rust
    variant (what `phyfarm build --variant rust` applies), then for the vng
    kernel bench/vng.config's options over them."""
    want: dict[str, str] = {}
    for frag in FRAGMENTS:
        want.update(config_lines(frag.read_text().splitlines()))
    if vng:
        want.update(config_lines(vng_options()))
    return want


def stale_options(kernel: Path, vng: bool) -> list[str] | None:
    """The options the kernel's .config does not hold as the fragments (and
    for vng bench/vng.config) ask, spelled as asked; None: no .config."""
    config = kernel.parent / ".config"
    if not config.is_file():
        return None
    have = config_lines(config.read_text(errors="replace").splitlines())
    return [
        f"{k}={v}" if v != "n" else f"# {k} is not set"
        for k, v in wanted_config(vng).items()
        if have.get(k, "n") != v
    ]


def build(out: Path, vng: bool) -> None:
    argv = build_argv(out, vng)
    log("I", f"building {out} (waiting for {BUILD_LOCK}): {' '.join(argv)}")
    t = time.monotonic()
    with open(BUILD_LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        run_tool(argv, f"phyfarm build -o {out}", timeout=7200)
    log("I", f"built {out} in {time.monotonic() - t:.0f}s")


def kernel_info(kernel: Path, role: str) -> dict:
    if not kernel.is_file():
        raise CannotRun(f"no {role} kernel {kernel}")
    try:
        meta = json.loads((kernel.parent / "metadata.json").read_text())
    except (OSError, ValueError) as e:
        raise CannotRun(
            f"the {role} kernel {kernel} has no readable metadata.json beside it ({e}): "
            "cannot tell which distro source it was built from (build it with phyfarm build)"
        ) from e
    return {
        "path": str(kernel),
        "variant": meta.get("variant"),
        "kernel_package": meta.get("kernel_package"),
        "kernel_version": meta.get("kernel_version"),
        "config_hash": meta.get("config_hash"),
        "reproducer": meta.get("reproducer"),
    }


def prepare_kernels(args) -> tuple[dict, dict]:
    out = cache_dir() / "out"
    pk = (args.kernel or out / "rust/bzImage").absolute()
    vk = (args.vng_kernel or out / "vng/bzImage").absolute()
    # Both kernels are checked against this checkout's fragments: a kernel
    # built before a fragment changed boots differently from the farm's.
    for kernel, vng, given, role in (
        (pk, False, args.kernel, "phyfarm kernel"),
        (vk, True, args.vng_kernel, "kernel for the vng reference"),
    ):
        if args.build and given is None and (not kernel.is_file() or stale_options(kernel, vng)):
            build(kernel.parent, vng=vng)
        again = f"{' '.join(build_argv(kernel.parent, vng))} (or --build)"
        if not kernel.is_file():
            raise CannotRun(f"no {role} {kernel}: {again}")
        stale = stale_options(kernel, vng)
        if stale is None:
            raise CannotRun(
                f"no .config beside the {role} {kernel}: cannot tell how it was configured"
            )
        if stale:
            what = "phyfarm's fragments" + (" and bench/vng.config" if vng else "")
            raise CannotRun(
                f"the {role} {kernel} is not configured as {what} ask "
                f"({', '.join(stale[:6])}{' ...' if len(stale) > 6 else ''}): {again}"
            )
    p, v = kernel_info(pk, "phyfarm"), kernel_info(vk, "vng")
    src = lambda k: (k["kernel_package"], k["kernel_version"])  # noqa: E731
    if None in src(p) or src(p) != src(v):
        raise CannotRun(
            f"the kernels are not from the same distro source: phyfarm {src(p)}, vng {src(v)}"
        )
    return p, v


# -- accelerator ---------------------------------------------------------------
def resolve_accel(want: str, kernel: Path) -> tuple[str, str]:
    """auto: phyfarm's KVM probe for this host boot (`phyfarm boot` runs it
    and caches the answer in <cache>/accel-probe.json), else TCG."""
    if want != "auto":
        return want, "requested"
    try:
        os.close(os.open("/dev/kvm", os.O_RDWR))
    except OSError as e:
        return "tcg", f"no usable KVM device (/dev/kvm: {e.strerror})"
    probe = cache_dir() / "accel-probe.json"
    boot_id = Path("/proc/sys/kernel/random/boot_id").read_text().strip()

    def cached() -> dict:
        with contextlib.suppress(OSError, ValueError):
            rec = json.loads(probe.read_text())
            if rec.get("boot_id") == boot_id:
                return rec
        return {}

    rec = cached()
    if not rec:
        log("I", "probing KVM with a short boot (phyfarm boot --accel auto)")
        with tempfile.TemporaryDirectory() as d:
            subprocess.run(
                [str(phyfarm_bin()), "boot", "--kernel", str(kernel), "-o", d],
                capture_output=True,
                cwd=REPO,
                timeout=300,
            )
        rec = cached()
    if not rec:
        raise CannotRun("the KVM probe gave no answer (use --accel tcg or --accel kvm)")
    return ("kvm" if rec.get("kvm_usable") else "tcg"), f"KVM probe: {rec.get('reason')}"


def accel_of(cmdline: list[str]) -> str:
    """The accelerator a QEMU command line asks for (x86 QEMU's default is TCG)."""
    s = " ".join(cmdline)
    return "kvm" if ("-enable-kvm" in cmdline or "accel kvm" in s or "accel=kvm" in s) else "tcg"


def qemu_process(pid: int) -> dict | None:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        exe = os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return None
    argv = [a.decode(errors="replace") for a in argv if a]
    # The guest's QEMU, not a `qemu-system-x86_64 --version` query.
    if "qemu-system" not in os.path.basename(exe) or "-kernel" not in argv:
        return None
    return {"exe": exe.removesuffix(" (deleted)"), "argv": argv, "accel": accel_of(argv)}


def find_qemu_in_group(pgid: int) -> dict | None:
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid:
            q = qemu_process(int(d.name))
            if q is not None:
                return q
    return None


# -- the two sides ---------------------------------------------------------------
@dataclass
class Side:
    key: str
    runs: list[float] = field(default_factory=list)
    parts: list[dict] = field(default_factory=list)
    qemu: list[dict] = field(default_factory=list)

    def median(self) -> float:
        return statistics.median(self.runs)


def phyfarm_once(args, kernel: Path, image: Path, emulator: Path, logdir: Path) -> dict:
    """Boot one farm guest as phyfarm_farm.plugin.boot_farm does; seconds per stage."""
    sockdir = Path(tempfile.mkdtemp(prefix="phyfarm-bench-", dir="/tmp"))
    emu = guest = None
    try:
        t0 = time.monotonic()
        # The boot, not the PHY: the farm's 1.5-3 s autonegotiation
        # (REALISTIC_AUTONEG) would sit in the carrier stage of one side only.
        emu = Emulator(emulator, sockdir, logdir, ["--autoneg-ms", "0", "--autoneg-jitter-ms", "0"])
        emu.start(timeout=30)
        emu.ctl("pcap", action="start", path=str(logdir / "wire.pcap"))
        t_emu = time.monotonic()
        cfg = GuestConfig(
            kernel=kernel,
            initrd=image,
            accel=args.accel,
            timeout=args.timeout,
            usb=("unix", emu.usb_sock),
            wire=(emu.partner_wire, emu.emu_wire),
            tsc_khz=host_tsc_khz() if args.accel == "tcg" else None,
        )
        guest = Guest(cfg, sockdir, logdir)
        farm = Farm(guest=guest, emu=emu, variant="rust", accel=args.accel)
        guest.start()
        assert guest.agent is not None and guest.agent.ready_at is not None
        assert guest.started is not None and guest.proc is not None
        farm.find_interfaces(timeout=min(args.timeout, 60))
        t_if = time.monotonic()
        farm.setup_network(carrier_timeout=min(args.timeout, 30))
        t_link = time.monotonic()
        q = qemu_process(guest.proc.pid) or {"exe": "?", "argv": guest.argv, "accel": "?"}
        splats = guest.splats()
        if splats:
            raise CannotRun(f"the phyfarm guest kernel {splats[0].what} ({guest.console})")
        return {
            "total": t_link - t0,
            "emulator_ready": t_emu - t0,
            "qemu_to_agent": guest.agent.ready_at - guest.started,
            "interfaces": t_if - guest.agent.ready_at,
            "link_up": t_link - t_if,
            "qemu_to_link": t_link - guest.started,
            "qemu": q,
        }
    finally:
        if guest is not None:
            guest.stop()
        if emu is not None:
            emu.stop()
        shutil.rmtree(sockdir, ignore_errors=True)


def vng_argv(vng: Path, kernel: Path, accel: str, extra: list[str]) -> list[str]:
    argv = [str(vng), "--run", str(kernel)]
    if accel == "tcg":
        argv.append("--disable-kvm")
    return [*argv, *extra, "--exec", "true"]


def virtiofsd_candidate() -> str | None:
    """The first virtiofsd virtme-ng 1.42 would try (VirtioFS._get_virtiofsd_path)."""
    for p in (
        shutil.which("virtiofsd"),
        "/usr/libexec/virtiofsd",
        "/usr/lib/virtiofsd/virtiofsd",
        "/usr/lib/virtiofsd",
        "/usr/lib/qemu/virtiofsd",
    ):
        if p and os.path.isfile(p) and os.access(p, os.X_OK):
            return p
    return None


def vng_root(q: dict) -> str:
    """How vng's guest reached its root filesystem, from QEMU's command line."""
    s = " ".join(q["argv"])
    if "rootfstype=9p" in s:
        return "9p"
    if "rootfstype=virtiofs" in s or "vhost-user-fs" in s:
        return "virtiofs"
    return "?"


def vng_once(args, argv: list[str], log_path: Path) -> dict:
    """One `vng --run ... --exec true`, start to exit, in its own process group."""
    cwd = Path(tempfile.mkdtemp(prefix="phyfarm-bench-vng-", dir="/tmp"))
    t0 = time.monotonic()
    p = procs.Proc("vng", argv, log_path, cwd=cwd)
    q = None
    try:
        # Read QEMU's command line once it exists (then stop looking: polling
        # /proc must not take CPU from the guest being timed).
        while p.alive() and q is None and time.monotonic() - t0 < args.timeout:
            q = find_qemu_in_group(p.pid)
            if q is None:
                time.sleep(0.1)
        try:
            p.popen.wait(timeout=max(1.0, args.timeout - (time.monotonic() - t0)))
        except subprocess.TimeoutExpired as e:
            raise CannotRun(f"vng did not finish within {args.timeout:.0f}s ({log_path})") from e
        t1 = time.monotonic()
    finally:
        rc = p.stop(grace=1.0)
        shutil.rmtree(cwd, ignore_errors=True)
    if rc != 0:
        raise CannotRun(f"vng exited with {rc}: the reference cannot run ({log_path}):\n{p.tail()}")
    if q is None:
        raise CannotRun(f"vng ran no QEMU process that could be seen ({log_path})")
    return {"total": t1 - t0, "qemu": q}


# -- main ------------------------------------------------------------------------
def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="bench/boot-vs-vng.sh",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n\n".join(__doc__.split("\n\n")[1:]),
    )
    p.add_argument(
        "--repeat", type=int, default=MIN_REPEAT, help=f"rounds, >= {MIN_REPEAT} [{MIN_REPEAT}]"
    )
    p.add_argument("--kernel", type=Path, help="phyfarm's kernel [<cache>/out/rust/bzImage]")
    p.add_argument(
        "--vng-kernel", type=Path, help="kernel with bench/vng.config [<cache>/out/vng/bzImage]"
    )
    p.add_argument(
        "--build",
        action="store_true",
        help="build a default kernel that is missing, or not configured as phyfarm's "
        "fragments (and for vng bench/vng.config) ask, first",
    )
    p.add_argument("--accel", choices=("auto", "kvm", "tcg"), default="auto", help="[auto]")
    p.add_argument("--vng", type=Path, help="the vng program [<cache>/venv/bin/vng]")
    p.add_argument(
        "--vng-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="one more argument for vng, before --exec (repeatable; e.g. --vng-arg=--force-9p)",
    )
    p.add_argument("--emulator", type=Path, help="ax88772-emu [built: target/release]")
    p.add_argument("--guest-image", type=Path, help="farm initramfs [phyfarm guest image]")
    p.add_argument("--timeout", type=float, default=180.0, help="per boot, seconds [180]")
    p.add_argument("-o", "--out", type=Path, help="output folder [<cache>/bench/boot-vs-vng-*]")
    a = p.parse_args(argv)
    if a.repeat < MIN_REPEAT:
        p.error(f"--repeat must be >= {MIN_REPEAT} (a median of at least {MIN_REPEAT} each)")
    return a


def prepare(args) -> dict:
    qemu = shutil.which("qemu-system-x86_64")
    if qemu is None:
        raise CannotRun("qemu-system-x86_64 is not installed (bash containers/host-setup.sh)")
    vng = (args.vng or cache_dir() / "venv/bin/vng").absolute()
    if not (vng.is_file() and os.access(vng, os.X_OK)):
        raise CannotRun(
            f"vng (virtme-ng) is not installed at {vng}: bash containers/host-setup.sh "
            "installs it from pytest-tests/requirements.txt"
        )
    # vng runs virtme-run from PATH: the venv's bin directory goes first.
    os.environ["PATH"] = f"{vng.parent}{os.pathsep}{os.environ.get('PATH', '')}"
    if shutil.which("virtme-run") is None:
        raise CannotRun(f"virtme-run is not beside {vng} (a broken virtme-ng install)")
    vng_version = run_tool([str(vng), "--version"], "vng --version").strip()
    if not phyfarm_bin().is_file():
        run_tool(["cargo", "build", "--quiet", "-p", "phyfarm"], "cargo build -p phyfarm")
    pk, vk = prepare_kernels(args)
    emulator = args.emulator
    if emulator is None:
        run_tool(
            ["cargo", "build", "--quiet", "--release", "-p", "ax88772", "--bin", "ax88772-emu"],
            "cargo build --release -p ax88772",
        )
        emulator = REPO / "target/release/ax88772-emu"
    image = args.guest_image
    if image is None:
        out = run_tool([str(phyfarm_bin()), "guest", "image"], "phyfarm guest image")
        image = Path(out.strip().splitlines()[-1])
    if not image.is_file():
        raise CannotRun(f"no guest image {image}")
    return {
        "qemu": qemu,
        "qemu_version": run_tool([qemu, "--version"], "qemu --version").splitlines()[0],
        "vng": vng,
        "vng_version": vng_version,
        "phyfarm_kernel": pk,
        "vng_kernel": vk,
        "emulator": emulator.absolute(),
        "guest_image": image.absolute(),
    }


def check_same(side: str, q: dict, env: dict, accel: str) -> None:
    """Each side ran the host's QEMU under the chosen accelerator."""
    if q["accel"] != accel:
        raise CannotRun(f"{side}'s QEMU ran under {q['accel']}, not {accel}: {q['argv']}")
    if os.path.realpath(q["exe"]) != os.path.realpath(env["qemu"]):
        raise CannotRun(f"{side} ran {q['exe']}, not {env['qemu']}: not the same QEMU")


def fmt_runs(xs: list[float]) -> str:
    return " ".join(f"{x:.2f}" for x in xs)


def report(args, env: dict, why: str, pf: Side, vg: Side, vng_cmd: str) -> float:
    med = {k: statistics.median(p[k] for p in pf.parts) for k in pf.parts[0] if k != "qemu"}
    ratio = pf.median() / vg.median()
    pk, vk = env["phyfarm_kernel"], env["vng_kernel"]
    roots = sorted({vng_root(q) for q in vg.qemu})
    lines = [
        f"Boot to a guest ready for checks: median of {args.repeat} each, alternating "
        "(one warm-up each, not counted)",
        f"  accelerator  {args.accel} ({why}); read back from both QEMU processes",
        f"  QEMU         {env['qemu']}, {env['qemu_version']} (both)",
        f"  kernels      {pk['kernel_package']} {pk['kernel_version']} via phyfarm build: "
        f"phyfarm {pk['path']}, vng {vk['path']} (+ bench/vng.config)",
        "",
        f"  phyfarm  emulator start -> agent up, AX88772A carrier  {pf.median():6.2f} s"
        f"   runs {fmt_runs(pf.runs)}",
        f"           QEMU start -> agent {med['qemu_to_agent']:.2f} s, interfaces "
        f"{med['interfaces']:.2f} s, link up {med['link_up']:.2f} s "
        f"(emulator ready {med['emulator_ready']:.2f} s)",
        f"  vng      start -> exit, root over {'/'.join(roots)}"
        f"{'':{max(0, 27 - len('/'.join(roots)))}}{vg.median():6.2f} s   runs {fmt_runs(vg.runs)}",
        f"           {env['vng_version']}: {vng_cmd}",
        "",
        f"  ratio phyfarm / vng  {ratio:.3f}   (target <= {TARGET}: "
        + ("met)" if ratio <= TARGET else "NOT met)"),
    ]
    vfsd = virtiofsd_candidate()
    if "9p" in roots and "--force-9p" not in args.vng_arg and vfsd is not None:
        lines += [
            "",
            f"  note: vng found {vfsd}, but its root is on 9p: that virtiofsd did not start",
            "  (QEMU 7.2's C virtiofsd does not take virtme-ng's options), and vng's time includes",
            "  waiting for it (up to 3.1 s). --vng-arg=--force-9p times vng without that wait.",
        ]
    print("\n".join(lines), flush=True)
    return ratio


def write_json(path: Path, doc: dict) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(json.dumps(doc, indent=2, default=str) + "\n")
    tmp.replace(path)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    procs.install_sigterm_handler()
    log("I", "bench/boot-vs-vng.sh " + " ".join(argv))
    stamp = time.strftime("%Y%m%dT%H%M%S")
    out = (args.out or cache_dir() / "bench" / f"boot-vs-vng-{stamp}").absolute()
    doc: dict = {"command": " ".join(["bench/boot-vs-vng.sh", *argv]), "status": "ERROR"}
    pf, vg = Side("phyfarm"), Side("vng")
    try:
        env = prepare(args)
        pk, vk = env["phyfarm_kernel"], env["vng_kernel"]
        args.accel, why = resolve_accel(args.accel, Path(pk["path"]))
        out.mkdir(parents=True, exist_ok=True)
        vargv = vng_argv(env["vng"], Path(vk["path"]), args.accel, args.vng_arg)
        vng_cmd = " ".join(["vng", *vargv[1:]])
        log("I", f"accel {args.accel} ({why}); QEMU {env['qemu']} {env['qemu_version']}")
        log("I", f"{env['vng_version']}; output in {out}")
        doc.update(
            accel=args.accel,
            accel_reason=why,
            qemu=env["qemu"],
            qemu_version=env["qemu_version"],
            vng_version=env["vng_version"],
            vng_command=vargv,
            kernels={"phyfarm": pk, "vng": vk},
            emulator=str(env["emulator"]),
            guest_image=str(env["guest_image"]),
            repeat=args.repeat,
        )

        def one(side: Side, tag: str, count: bool) -> None:
            if side is pf:
                r = phyfarm_once(
                    args, Path(pk["path"]), env["guest_image"], env["emulator"], out / tag
                )
                check_same("phyfarm", r["qemu"], env, args.accel)
                if count:
                    side.parts.append(r)
            else:
                (out / tag).mkdir(parents=True, exist_ok=True)
                r = vng_once(args, vargv, out / tag / "vng.log")
                check_same("vng", r["qemu"], env, args.accel)
            log("I", f"{tag}: {r['total']:.2f}s" + ("" if count else " (warm-up, not counted)"))
            if count:
                side.runs.append(r["total"])
                side.qemu.append(r["qemu"])

        doc["loadavg_before"] = [round(x, 2) for x in os.getloadavg()]
        one(pf, "warmup-phyfarm", False)
        one(vg, "warmup-vng", False)
        for rnd in range(1, args.repeat + 1):
            order = (pf, vg) if rnd % 2 else (vg, pf)
            for side in order:
                one(side, f"{rnd}-{side.key}", True)
    except (CannotRun, FarmError, OSError) as e:
        log("E", f"could not run the benchmark: {e}")
        doc["error"] = str(e)
        if out.is_dir():
            write_json(out / "results.json", doc)
            log("I", f"output: {out}")
        return 2
    doc["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    log(
        "I",
        f"host load average (1/5/15 min) before {doc['loadavg_before']}, after "
        f"{doc['loadavg_after']}: the two sides alternate, so load hits both alike",
    )
    ratio = report(args, env, why, pf, vg, vng_cmd)
    doc.update(
        status="DONE",
        phyfarm={"median_s": pf.median(), "runs_s": pf.runs, "stages": pf.parts},
        vng={
            "median_s": vg.median(),
            "runs_s": vg.runs,
            "root": sorted({vng_root(q) for q in vg.qemu}),
            "qemu": vg.qemu,
        },
        ratio=ratio,
        target=TARGET,
        met=ratio <= TARGET,
    )
    write_json(out / "results.json", doc)
    log("I", f"output: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
