"""The foundation end to end: images, both kernel variants built in containers,
both booted in QEMU, and the errors a user meets on bad input."""

from __future__ import annotations

import re

import pytest

from conftest import read_json

pytestmark = pytest.mark.slow


def test_doctor_reports_every_prerequisite(phyfarm, podman):
    r = phyfarm("doctor")
    assert r.code == 0, r.describe()
    for what in ("podman", "runc", "mmdebstrap", "qemu-system-x86_64", "accelerator", "free disk"):
        assert what in r.stdout, f"doctor does not report {what}:\n{r.describe()}"


def test_images_are_built_and_tagged_by_content(phyfarm, podman):
    r = phyfarm("images")
    assert r.code == 0, r.describe()
    lines = {line.split()[0]: line for line in r.stdout.splitlines() if line.strip()}
    assert set(lines) == {"base", "kbuild", "farm", "guest", "emulator"}, r.describe()
    assert "linux-source-6.12 6.12." in lines["kbuild"], r.describe()
    # With the farm image: the guest image built from it, and the emulator.
    assert lines["guest"].split()[1].endswith(".cpio"), r.describe()
    assert lines["emulator"].split()[1].endswith("/ax88772-emu"), r.describe()
    # A second call builds nothing.
    again = phyfarm("images")
    assert again.code == 0 and "building image" not in again.stderr, again.describe()


@pytest.fixture(scope="module")
def built(phyfarm, podman, tmp_path_factory):
    """Both variants, built once for the module (rust first: c reuses its tree)."""
    out = {}
    for variant in ("rust", "c"):
        d = tmp_path_factory.mktemp(f"build-{variant}")
        r = phyfarm("build", "--variant", variant, "-o", str(d))
        out[variant] = (d, r)
    return out


@pytest.mark.parametrize("variant", ["rust", "c"])
def test_build_writes_kernel_and_metadata(built, variant):
    d, r = built[variant]
    assert r.code == 0, r.describe()
    assert r.stdout.strip().splitlines()[-1] == str(d), "last line must name the output folder"
    assert (d / "bzImage").stat().st_size > 1_000_000
    meta = read_json(d / "metadata.json")
    assert meta["status"] == "PASS"
    assert meta["variant"] == variant
    assert meta["kernel_package"] == "linux-source-6.12"
    assert meta["kernel_version"].startswith("6.12.")
    assert meta["image"]["name"].startswith("localhost/phyfarm-kbuild:")
    for tool in ("rustc", "bindgen", "clang", "gcc"):
        assert tool in meta["tools"], f"{tool} version not recorded: {meta['tools']}"
    assert [k for k, _ in meta["durations"]] == ["images", "source", "configure", "build"]
    assert meta["reproducer"].startswith(f"phyfarm build --variant {variant}")
    log = (d / "build.log").read_text()
    assert log.startswith("# reproduce: phyfarm build"), log[:200]
    config = (d / ".config").read_text()
    want = (
        "CONFIG_AX88796B_RUST_PHY=y"
        if variant == "rust"
        else "# CONFIG_AX88796B_RUST_PHY is not set"
    )
    assert want in config
    assert "CONFIG_RUST=y" in config


@pytest.mark.parametrize("variant", ["rust", "c"])
def test_boot_proves_the_driver_from_inside_the_guest(phyfarm, built, variant, tmp_path):
    d, r = built[variant]
    assert r.code == 0, r.describe()
    b = phyfarm("boot", "--kernel", str(d / "bzImage"), "-o", str(tmp_path), timeout=600)
    assert b.code == 0, b.describe()
    rec = read_json(tmp_path / "boot.json")
    assert rec["status"] == "PASS"
    assert rec["accel"] in ("kvm", "tcg")
    assert rec["kernel_release"].startswith("6.12."), rec
    names = {c["name"]: c["ok"] for c in rec["checks"]}
    impl = "Rust" if variant == "rust" else "C"
    assert names == {
        "usb driver asix registered": True,
        'phy driver "Asix Electronics AX88772A" registered': True,
        f"phy driver is the {impl} one": True,
    }, rec
    assert (tmp_path / "console.log").stat().st_size > 0


def test_boot_with_the_wrong_expectation_fails(phyfarm, built, tmp_path):
    d, r = built["c"]
    assert r.code == 0, r.describe()
    b = phyfarm(
        "boot", "--kernel", str(d / "bzImage"), "--expect-variant", "rust", "-o", str(tmp_path)
    )
    assert b.code == 1, b.describe()
    assert "FAIL: phy driver is the Rust one" in b.stderr


def test_warm_rebuild_reuses_everything(phyfarm, built, tmp_path):
    d, r = built["rust"]
    assert r.code == 0, r.describe()
    again = phyfarm("build", "--variant", "rust", "-o", str(tmp_path))
    assert again.code == 0, again.describe()
    assert "configuration unchanged" in again.stderr, again.describe()
    assert (
        read_json(tmp_path / "metadata.json")["config_hash"]
        == read_json(d / "metadata.json")["config_hash"]
    )


@pytest.fixture(scope="module")
def scratch_cache(tmp_path_factory):
    """A cache of its own for configs meant to fail, so the shared build trees
    keep their configuration."""
    return tmp_path_factory.mktemp("cache")


def test_unknown_config_option_is_named(phyfarm, podman, scratch_cache, tmp_path):
    r = phyfarm(
        "--cache",
        str(scratch_cache),
        "build",
        "--variant",
        "rust",
        "-o",
        str(tmp_path),
        "-K",
        "CONFIG_PHYFARM_NO_SUCH_OPTION=y",
    )
    assert r.code == 2, r.describe()
    assert "-K:1: CONFIG_PHYFARM_NO_SUCH_OPTION does not exist" in r.stderr, r.describe()
    assert not (tmp_path / "bzImage").exists()


def test_option_that_does_not_stick_names_its_dependency(phyfarm, podman, scratch_cache, tmp_path):
    r = phyfarm(
        "--cache",
        str(scratch_cache),
        "build",
        "--variant",
        "rust",
        "-o",
        str(tmp_path),
        "-K",
        "CONFIG_RUST_PHYLIB_ABSTRACTIONS=n",
    )
    assert r.code == 2, r.describe()
    assert "variant-rust.config:2: CONFIG_AX88796B_RUST_PHY=y did not stick" in r.stderr, (
        r.describe()
    )
    assert "depends on RUST_PHYLIB_ABSTRACTIONS && AX88796B_PHY" in r.stderr, r.describe()
    assert "RUST_PHYLIB_ABSTRACTIONS=n" in r.stderr, r.describe()


def test_dry_run_prints_the_exact_commands(phyfarm, podman):
    r = phyfarm("build", "--variant", "c", "--dry-run")
    assert r.code == 0, r.describe()
    lines = r.stdout.splitlines()
    assert any("tinyconfig" in x for x in lines)
    assert any("variant-c.config" in x and "merge_config.sh" in x for x in lines)
    assert lines[-1].startswith("podman run --rm") and lines[-1].endswith("bzImage")
    assert "--network=none" in lines[-1]


def test_usage_errors_exit_2(phyfarm, tmp_path):
    r = phyfarm("build", "--variant", "go")
    assert r.code == 2 and "invalid value 'go'" in r.stderr, r.describe()
    missing = tmp_path / "nope" / "bzImage"
    r = phyfarm("boot", "--kernel", str(missing))
    assert r.code == 2, r.describe()
    assert r.stderr.startswith("E: kernel ") and str(missing) in r.stderr, r.describe()
    assert "Traceback" not in r.stderr and "panicked" not in r.stderr


def test_bad_cache_path_is_refused(phyfarm, tmp_path):
    r = phyfarm("--cache", str(tmp_path / "a:b"), "doctor")
    assert r.code == 2 and "contains ',' or ':'" in r.stderr, r.describe()


def test_fragment_syntax_error_names_file_and_line(phyfarm, tmp_path):
    r = phyfarm("build", "--variant", "rust", "--dry-run", "-K", "AX88796B=y")
    assert r.code == 2 and "-K option 1" in r.stderr, r.describe()


def test_a_kconfig_fragment_adds_its_options_to_the_build(phyfarm, tmp_path):
    """--kconfig-fragment FILE builds what the same options given with -K
    build (one build tree: the same extra configuration); a bad fragment is
    refused naming its file and line, a missing one naming the file."""

    def tree(*args: str) -> str:
        r = phyfarm("build", "--variant", "c", "--dry-run", "-o", str(tmp_path / "o"), *args)
        assert r.code == 0, r.describe()
        trees = set(re.findall(r"src=([^,\s]+),dst=/build(?=\s)", r.stdout))
        assert len(trees) == 1, r.describe()
        return trees.pop()

    frag = tmp_path / "extra.config"
    frag.write_text("# a comment\nCONFIG_USB_GADGET=y\n# CONFIG_USB_NET_AX8817X is not set\n")
    by_fragment = tree("--kconfig-fragment", str(frag))
    assert by_fragment == tree("-K", "CONFIG_USB_GADGET=y", "-K", "CONFIG_USB_NET_AX8817X=n")
    assert by_fragment != tree("-K", "CONFIG_USB_GADGET=y")
    frag.write_text("CONFIG_USB_GADGET=y\nnot an option\n")
    r = phyfarm("build", "--variant", "c", "--dry-run", "--kconfig-fragment", str(frag))
    assert r.code == 2 and f"{frag}:2: cannot parse" in r.stderr, r.describe()
    missing = tmp_path / "missing.config"
    r = phyfarm("build", "--variant", "c", "--dry-run", "--kconfig-fragment", str(missing))
    assert r.code == 2 and f"cannot read {missing}" in r.stderr, r.describe()
    assert r.stderr.count("No such file") == 1, r.describe()
