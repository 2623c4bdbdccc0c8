"""What one xdist worker shares (`farm_env`): the phyfarm binary, the guest
plan phyfarm resolved (kernels, emulator, guest image, accelerator,
machine), the link partner's side; and the variants a run covers."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from .errors import MissingKernel, SetupError
from .guest import cache_dir, phyfarm_binary, use_machine
from .partner import host_partner_unavailable, namespace_method, sweep_stale_namespaces

REPO = Path(__file__).resolve().parents[2]


@contextlib.contextmanager
def _locked(name: str):
    cache_dir().mkdir(parents=True, exist_ok=True)
    with open(cache_dir() / f".{name}.lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _run(argv: list[str], what: str, timeout: float = 3600) -> str:
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=REPO)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise SetupError(f"{what}: {e}") from e
    if p.returncode != 0:
        raise SetupError(f"{what} failed ({p.returncode}): {' '.join(argv)}\n{p.stderr[-3000:]}")
    return p.stdout


@dataclass
class FarmEnv:
    config: pytest.Config
    results_dir: Path
    phyfarm: Path
    emulator: Path | None
    guest_image: Path
    accel: str
    accel_reason: str
    device: str
    timeout: float
    kernels: dict = field(default_factory=dict)
    #: The exporter guest's kernel (forwarded-gadget), else None.
    exporter: Path | None = None
    #: Where the link partner runs: "host" (HostPartner) or "guest".
    partner: str = "guest"
    partner_reason: str = ""

    def kernel(self, variant: str) -> Path:
        if variant not in self.kernels:
            raise MissingKernel(f"no {variant} kernel in the guest plan")
        return self.kernels[variant]

    def exporter_kernel(self) -> Path:
        if self.exporter is None:
            raise MissingKernel("no exporter kernel in the guest plan")
        return self.exporter


#: --device value of the forwarded-gadget path.
GADGET = "forwarded-gadget"


def selected_variants(config: pytest.Config) -> list[str]:
    """The variants a run covers, without building anything: the guest plan's
    kernels when `phyfarm test` handed one over, else what `phyfarm guest
    variants` says of this run's options."""
    cached = getattr(config, "_phyfarm_variants", None)
    if cached is not None:
        return cached
    given = config.getoption("--guest-plan")
    if given:
        try:
            vs = list(json.loads(Path(given).read_text())["variants"])
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise pytest.UsageError(f"--guest-plan {given}: {e!r}") from e
    else:
        argv = [str(_phyfarm()), "guest", "variants"]
        for opt in ("--kernel", "--artifacts"):
            if config.getoption(opt):
                argv += [opt, config.getoption(opt)]
        for v in config.getoption("--variant") or []:
            argv += ["--variant", v]
        try:
            vs = _run(argv, "phyfarm guest variants", timeout=120).split()
        except SetupError as e:
            raise pytest.UsageError(str(e)) from e
    config._phyfarm_variants = vs  # type: ignore[attr-defined]
    return vs


def _phyfarm() -> Path:
    """The phyfarm binary, built when it is missing."""
    phyfarm = phyfarm_binary()
    with _locked("cargo"):
        if not phyfarm.is_file():
            _cargo_build(["-p", "phyfarm"], "phyfarm")
    return phyfarm


def _cargo_build(args: list[str], what: str) -> None:
    env = dict(os.environ)
    env.setdefault("CARGO_BUILD_JOBS", "1")
    try:
        p = subprocess.run(
            ["cargo", "build", "--quiet", *args],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=1800,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise SetupError(f"cannot build {what}: {e}") from e
    if p.returncode != 0:
        raise SetupError(f"cannot build {what}:\n{p.stderr[-3000:]}")


#: The guest plan's JSON Schema, which guest::plan::GuestPlan also follows.
PLAN_SCHEMA = REPO / "pipeline" / "schema" / "guest-plan.schema.json"


def validate_plan(doc, where: str) -> dict:
    """The plan, if it is one phyfarm could have written; else a SetupError
    naming where it came from and the field at fault."""
    import jsonschema

    try:
        jsonschema.validate(doc, json.loads(PLAN_SCHEMA.read_text()))
    except jsonschema.ValidationError as e:
        field = "/".join(str(p) for p in e.absolute_path) or "(document)"
        raise SetupError(
            f"{where}: not a guest plan ({PLAN_SCHEMA.name}) at {field}: {e.message}"
        ) from None
    return doc


def guest_plan(cfg: pytest.Config, phyfarm: Path) -> dict:
    """What the guests need, resolved by phyfarm: the file `phyfarm test`
    wrote, or `phyfarm guest plan` asked with this run's options (it builds
    what is missing: the cache's kernels, the emulator, the guest image).
    Either way it is held to the plan's schema before anything boots."""
    given = cfg.getoption("--guest-plan")
    if given:
        try:
            doc = json.loads(Path(given).read_text())
        except (OSError, ValueError) as e:
            raise SetupError(f"--guest-plan {given}: {e}") from e
        return validate_plan(doc, f"--guest-plan {given}")
    argv = [str(phyfarm), "guest", "plan", "--accel", cfg.getoption("--accel"), "--json"]
    if cfg.getoption("--kernel"):
        argv += ["--kernel", cfg.getoption("--kernel")]
    elif cfg.getoption("--artifacts"):
        argv += ["--artifacts", cfg.getoption("--artifacts")]
    else:
        argv += ["--default-kernels"]
    for v in selected_variants(cfg):
        argv += ["--variant", v]
    if cfg.getoption("--guest-image") is not None:
        argv += ["--image", cfg.getoption("--guest-image")]
    # The device decides what phyfarm builds (the emulator, the exporter
    # kernel); what is given here is used instead.
    argv += ["--device", cfg.getoption("--device")]
    for opt in ("--emulator", "--exporter-kernel"):
        if cfg.getoption(opt):
            argv += [opt, cfg.getoption(opt)]
    with _locked("guest-plan"):
        doc = json.loads(_run(argv, "phyfarm guest plan", timeout=3600))
    return validate_plan(doc, "phyfarm guest plan")


@pytest.fixture(scope="session")
def farm_env(request: pytest.FixtureRequest) -> FarmEnv:
    cfg = request.config
    if shutil.which("qemu-system-x86_64") is None:
        raise SetupError("qemu-system-x86_64 is not installed (bash containers/host-setup.sh)")
    phyfarm = _phyfarm()
    # phyfarm resolves the guests once: the kernels, the emulator, the image,
    # KVM or TCG (probed with a short boot of the first kernel), and the QEMU
    # machine for it. The harness only runs checks.
    plan = guest_plan(cfg, phyfarm)
    emu = Path(plan["emulator"]) if plan.get("emulator") else None
    if cfg.getoption("--device") in ("emulated", GADGET) and emu is None:
        raise SetupError("the guest plan has no emulator for --device " + cfg.getoption("--device"))
    results_dir: Path = cfg._phyfarm_results_dir  # type: ignore[attr-defined]
    env = FarmEnv(
        config=cfg,
        results_dir=results_dir,
        phyfarm=phyfarm,
        emulator=emu,
        guest_image=Path(plan["guest_image"]),
        accel=plan["accel"],
        accel_reason=plan["accel_reason"],
        device=cfg.getoption("--device"),
        timeout=cfg.getoption("--guest-timeout"),
        kernels={v: Path(k) for v, k in (plan.get("kernels") or {}).items()},
        exporter=Path(plan["exporter_kernel"]) if plan.get("exporter_kernel") else None,
    )
    env.partner, env.partner_reason = choose_partner(cfg.getoption("--partner"), env.device)
    if env.partner == "host":
        sweep_stale_namespaces()
    use_machine(env.accel, plan["machine"])
    results_dir.mkdir(parents=True, exist_ok=True)
    qv = subprocess.run(["qemu-system-x86_64", "--version"], capture_output=True, text=True)
    envdoc = {
        "accel": env.accel,
        "accel_reason": env.accel_reason,
        "partner": env.partner,
        "partner_reason": env.partner_reason,
        "qemu": qv.stdout.splitlines()[0] if qv.stdout else "",
        "guest_image": str(env.guest_image),
        "device": env.device,
        "emulator": str(emu) if emu else None,
        "flaps": cfg.getoption("--flaps"),
        "guest_timeout": env.timeout,
        "command": " ".join(sys.argv),
    }
    tmp = results_dir / f".environment.{os.getpid()}"
    tmp.write_text(json.dumps(envdoc, indent=2))
    tmp.replace(results_dir / "environment.json")
    return env


def choose_partner(option: str, device: str) -> tuple[str, str]:
    """("host" or "guest", why) for --partner on --device."""
    if device != "emulated":
        if option == "host":
            raise SetupError(f"--partner host needs --device emulated, not {device}")
        return "guest", f"--device {device}: the wire does not pass through ax88772-emu's host side"
    if option == "guest":
        return "guest", "--partner guest"
    why = host_partner_unavailable()
    if why is not None:
        if option == "host":
            raise SetupError(f"--partner host cannot run here: {why}")
        return "guest", f"the host-side partner cannot run here: {why}"
    if namespace_method() == "user":
        return "host", (
            "the host's stack in a network namespace of this user's own user namespace "
            "(unshare -Urn) on the emulator's tap"
        )
    return "host", "the host's stack in a network namespace on the emulator's tap"
