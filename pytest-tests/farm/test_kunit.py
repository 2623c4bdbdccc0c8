"""Rust KUnit doctests in the guest: a kernel built with
`-K CONFIG_RUST_KERNEL_DOCTESTS=y -K CONFIG_KUNIT_DEFAULT_ENABLED=y` runs them at boot; the
KTAP they print is read from the kernel log through the agent and parsed into
one result per case. `phyfarm run` builds that kernel from the patched tree
into <run>/rust-kunit (the base's into <run>/base/rust-kunit); `make farm`
builds the base's into <cache>/out/rust-kunit."""

from __future__ import annotations

from pathlib import Path

import pytest
from phyfarm_farm import ktap
from phyfarm_farm.errors import HarnessError
from phyfarm_farm.plugin import BootSpec, boot_farm, cache_dir

# On top of the farm's kernel, which has KUnit built in and off.
KUNIT_OPTIONS = "-K CONFIG_RUST_KERNEL_DOCTESTS=y -K CONFIG_KUNIT_DEFAULT_ENABLED=y"


def kunit_kernel(config) -> Path:
    """--kunit-kernel, else rust-kunit/bzImage beside the variants' kernels."""
    opt = config.getoption("--kunit-kernel")
    if opt:
        return Path(opt)
    art = config.getoption("--artifacts")
    root = Path(art) if art else cache_dir() / "out"
    return root / "rust-kunit" / "bzImage"


@pytest.mark.check("farm.kunit")
@pytest.mark.single_variant
def test_rust_kunit_doctests(request, farm_env, variant, measure):
    k = kunit_kernel(request.config)
    if not k.is_file():
        pytest.skip(
            f"no KUnit kernel at {k}: build it with `phyfarm build --variant rust "
            f"{KUNIT_OPTIONS} -o {k.parent}`"
        )
    farm = boot_farm(
        request,
        farm_env,
        variant,
        BootSpec(kernel=k, network=False, usb=False, append="kunit.enable=1"),
    )
    r = farm.guest.run(["dmesg"], max_output=8 << 20)
    assert r.exit == 0, r.describe()
    cases, problems = ktap.parse(r.stdout)
    assert cases, f"the KUnit kernel printed no KTAP results (was it built with {KUNIT_OPTIONS}?)"
    for c in cases:
        request.node.user_properties.append(("subtest", c.to_json()))
    counts = {s: sum(1 for c in cases if c.status == s) for s in ("PASS", "FAIL", "SKIP")}
    for s, n in counts.items():
        measure(f"cases_{s.lower()}", n, "count")
    failed = [c for c in cases if c.status == "FAIL"]
    if failed:
        # The first failing case with its KTAP lines (the assertion and its
        # location), then the names of the others.
        first = failed[0]
        others = ", ".join(f"{c.suite}.{c.name}" for c in failed[1:20])
        raise AssertionError(
            f"{len(failed)} of {len(cases)} KUnit cases failed: {first.suite}.{first.name}\n"
            + "\n".join(first.lines[-12:])
            + (f"\nalso failed: {others}" if others else "")
        )
    if problems:
        # What ran is not what the KTAP plan announced: the run is not
        # complete (a case hung or the kernel stopped), not a verdict.
        raise HarnessError(f"KTAP plan not met: {'; '.join(problems[:10])}")
