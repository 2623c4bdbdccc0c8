"""Rust KUnit doctests in the guest: a kernel built with
`phyfarm build --variant rust -K CONFIG_KUNIT=y -K CONFIG_RUST_KERNEL_DOCTESTS=y
-o <cache>/out/rust-kunit` runs them at boot; the KTAP they print is read from
the kernel log through the agent and parsed into one result per case."""

from __future__ import annotations

from pathlib import Path

import pytest
from phyfarm_farm import ktap
from phyfarm_farm.plugin import BootSpec, boot_farm, cache_dir


def kunit_kernel(config) -> Path:
    opt = config.getoption("--kunit-kernel")
    return Path(opt) if opt else cache_dir() / "out" / "rust-kunit" / "bzImage"


@pytest.mark.check("farm.kunit")
@pytest.mark.single_variant
def test_rust_kunit_doctests(request, farm_env, variant, measure):
    k = kunit_kernel(request.config)
    if not k.is_file():
        pytest.skip(
            f"no KUnit kernel at {k}: build it with `phyfarm build --variant rust "
            f"-K CONFIG_KUNIT=y -K CONFIG_RUST_KERNEL_DOCTESTS=y -o {k.parent}`"
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
    assert cases, "the KUnit kernel printed no KTAP results (is CONFIG_KUNIT_DEFAULT_ENABLED on?)"
    for c in cases:
        request.node.user_properties.append(("subtest", c.to_json()))
    counts = {s: sum(1 for c in cases if c.status == s) for s in ("PASS", "FAIL", "SKIP")}
    for s, n in counts.items():
        measure(f"cases_{s.lower()}", n, "count")
    failed = [f"{c.suite}.{c.name}" for c in cases if c.status == "FAIL"]
    assert not failed, f"{len(failed)} of {len(cases)} KUnit cases failed: {failed[:20]}"
    assert not problems, f"KTAP plan not met: {problems}"
