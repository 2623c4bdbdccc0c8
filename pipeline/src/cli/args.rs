//! The command line's definitions: every verb, its options and their
//! `--help`, in one place so the whole interface is reviewed together.
//!
//! One file over 500 lines: splitting the options by verb would scatter the
//! one `--help` a reviewer reads as a whole.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use super::{parse_device, resolved_accel};
use crate::config::Variant;
use crate::guest::accel::Accel;
use crate::guest::machine;
use crate::kbuild::images::ImageKind;
use crate::sandbox::runtime::Runtime;

/// phyfarm builds Debian's linux-source-6.12 with Rust PHY patch series,
/// boots it in QEMU guests with an emulated ASIX AX88772A, and reports
/// netdev-style verdicts.
///
/// Exit codes: 0 everything passed, 1 a check failed (the code under test),
/// 2 the run could not be completed (bad input, infrastructure, usage).
#[derive(Debug, Parser)]
#[command(name = "phyfarm", version, max_term_width = 100)]
pub struct Cli {
    #[command(flatten)]
    pub global: Global,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Args)]
pub struct Global {
    /// Cache directory for kernel source, build trees and guest images
    /// [default: $XDG_CACHE_HOME/phyfarm or ~/.cache/phyfarm]
    #[arg(long, global = true, env = "PHYFARM_CACHE", value_name = "DIR")]
    pub cache: Option<PathBuf>,
    /// Where build steps run: podman containers, or the host's own toolchain
    #[arg(
        long,
        global = true,
        env = "PHYFARM_RUNTIME",
        value_enum,
        default_value = "podman"
    )]
    pub runtime: Runtime,
    /// Results store: an SQLite file, or a postgresql:// URL for a fleet of
    /// runners [default: <cache>/results.sqlite]
    #[arg(
        long,
        global = true,
        env = "PHYFARM_STORE",
        hide_env_values = true,
        value_name = "PATH|URL"
    )]
    pub store: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Check every host prerequisite and print each problem with its fix
    Doctor,
    /// Build the container images (base, kbuild, farm) if their inputs
    /// changed; with the farm image, the farm's guest image and the
    /// emulator's release build too, while the kbuild image builds
    Images(ImagesArgs),
    /// Build the distro kernel for a variant, or a series revision patch by patch (--series)
    Build(BuildArgs),
    /// Boot a kernel in QEMU and check the asix and AX88772A PHY drivers from inside
    Boot(BootArgs),
    /// Run `make` in a tree inside the build sandbox, exactly as a kernel
    /// build step runs (kbuild image, flags, limits, timeout), then copy
    /// bzImage, .config and System.map out as a build does. Shows what the
    /// sandbox allows on this host; the hostile-PR tests drive it.
    #[command(name = "sandbox-make")]
    SandboxMake(SandboxMakeArgs),
    /// The main job end to end on a series revision: ingest, per-patch apply
    /// and build in both variants, Rust gates, boot checks, the farm on the
    /// patched kernels and the base, recorded in the store with the verdict
    Run(RunArgs),
    /// Patch series: parse and show what phyfarm sees
    #[command(subcommand)]
    Series(SeriesCommand),
    /// The farm guest: its initramfs (busybox, iperf3, ethtool, ip, the agent),
    /// its QEMU machine, and the plan the farm starts from
    #[command(subcommand)]
    Guest(GuestCommand),
    /// Run the farm's checks (pytest-tests/farm) on a build's outputs and
    /// print a summary table; exit 0 all passed, 1 a check failed, 2 the run
    /// could not be completed
    Test(TestArgs),
    /// Run one farm check again on this machine, from a run's recorded
    /// artifacts (kernels, guest image, emulator and guest plan, each
    /// checked against its recorded SHA-256), nothing refetched or rebuilt;
    /// --shell leaves you in the guest afterwards, the emulated adapter
    /// attached. Exit 0 the check passed, 1 it failed, 2 it could not run
    Repro(ReproArgs),
    /// Record a revision built and tested in parts (a CI matrix): its
    /// `phyfarm build --series` folders and its farm result folders, checked
    /// against the plan, with the verdict
    Record(RecordArgs),
    /// Run the seeded faults of patches/selftest through `phyfarm run` and
    /// check each gets its verdict and evidence; exit 0 all caught, 1 one
    /// was not, 2 the self-test could not run
    Selftest(SelftestArgs),
    /// The farm's plan: every check a run must report, per variant (a
    /// planned check that does not report is MISS)
    #[command(subcommand)]
    Farm(FarmCommand),
    #[command(flatten)]
    Results(crate::cli::results::ResultsCommand),
    /// Serve the dashboards (series verdicts and clocks, revisions, runs,
    /// trends, farm) on 127.0.0.1:8080; runs `phyfarm-dashboard serve`
    /// (its options: `phyfarm serve --help`)
    #[command(disable_help_flag = true)]
    Serve(DashboardArgs),
    /// The dashboards as static files for GitHub Pages
    #[command(subcommand)]
    Dashboard(DashboardCommand),
    /// Follow a mailing list's public-inbox archive: run each new complete
    /// series revision, count maintainers' `pw-bot:` replies and NAKs, send
    /// one report mail per verdict change (its options: `phyfarm watch --help`)
    #[command(disable_help_flag = true)]
    Watch(DashboardArgs),
}

#[derive(Debug, Args)]
pub struct RecordArgs {
    /// The series revision (a directory of format-patch files or an mbox)
    #[arg(long, value_name = "DIR")]
    pub series: PathBuf,
    /// A `phyfarm build --series` output folder (repeatable: one per variant)
    #[arg(long = "build", value_name = "OUT", required = true)]
    pub builds: Vec<PathBuf>,
    /// A `phyfarm test` output folder (repeatable: one per matrix job)
    #[arg(long = "farm", value_name = "DIR")]
    pub farms: Vec<PathBuf>,
    /// A `phyfarm test` output folder of the base's kernels (repeatable);
    /// without it a judged throughput is MISS and the revision keeps testing
    #[arg(long = "base-farm", value_name = "DIR")]
    pub base_farms: Vec<PathBuf>,
    /// The farm check families the matrix planned [default: every check]
    #[arg(long, value_delimiter = ',', value_name = "CHECK")]
    pub checks: Vec<String>,
    /// The default branch's patches/ folder: a series it holds (same
    /// folder, name or change-id) gets revisions only from the `owners` of
    /// its series.toml there (with --author)
    #[arg(long, value_name = "DIR", requires = "author")]
    pub owners_from: Option<PathBuf>,
    /// Who opened the pull request, `github:<login>` (with --owners-from)
    #[arg(long, value_name = "WHO", requires = "owners_from")]
    pub author: Option<String>,
    /// Where results.json and results-base.json of the assembled runs go
    /// [default: <cache>/runs/<series>-v<N>-record]
    #[arg(short = 'o', long = "out", value_name = "OUT")]
    pub out: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct SelftestArgs {
    /// Only this case (repeatable) [default: every case in patches/selftest/cases.toml]
    #[arg(long = "case", value_name = "NAME")]
    pub cases: Vec<String>,
    /// Only the cases marked quick (what `make test` runs)
    #[arg(long)]
    pub quick: bool,
    /// Output folder: one run folder per case and the self-test's own store
    /// [default: <cache>/selftest, or <cache>/selftest-quick with --quick, so
    /// that `make test` keeps the last full self-test's store]
    #[arg(short = 'o', long = "out", value_name = "OUT")]
    pub out: Option<PathBuf>,
    /// Cases run at once: their kernel builds take turns, one case's farm
    /// runs while the next builds
    #[arg(short = 'j', long, value_name = "N", default_value_t = 2, value_parser = clap::value_parser!(u16).range(1..=16))]
    pub jobs: u16,
}

#[derive(Debug, Subcommand)]
pub enum FarmCommand {
    /// Print the checks a farm run must report (ids with their parameters)
    Plan {
        /// Variants the run covers
        #[arg(long, value_delimiter = ',', default_value = "rust,c")]
        variants: Vec<Variant>,
        /// The run includes the Rust KUnit kernel
        #[arg(long)]
        kunit: bool,
        /// As JSON
        #[arg(long)]
        json: bool,
    },
}

/// Arguments passed on to `phyfarm-dashboard` as they are.
#[derive(Debug, Args)]
pub struct DashboardArgs {
    #[arg(
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "ARGS"
    )]
    pub args: Vec<String>,
}

#[derive(Debug, Subcommand)]
pub enum DashboardCommand {
    /// Write every page as HTML and JSON into DIR; runs
    /// `phyfarm-dashboard export DIR [--base-url URL]`
    #[command(disable_help_flag = true)]
    Export(DashboardArgs),
}

#[derive(Debug, Subcommand)]
pub enum SeriesCommand {
    /// Parse a revision (a directory of format-patch files, or an mbox) and
    /// print its version, tree, change-id, patchset hash and patches
    Show {
        /// Directory of *.patch files (e.g. patches/rust-phy-enum-check/v8) or an mbox
        path: PathBuf,
        /// Print JSON instead of text
        #[arg(long)]
        json: bool,
    },
    /// Which Rust gates `phyfarm run` runs on a revision, and why. A gate
    /// whose inputs the revision does not touch (read from the dependency
    /// records of the rust variant's base build) is skipped, never passed
    Gates {
        /// Directory of *.patch files (e.g. patches/rust-phy-enum-check/v8) or an mbox
        path: PathBuf,
        /// Print JSON instead of text
        #[arg(long)]
        json: bool,
    },
    /// List the revisions (patches/<series>/v<N>/) changed from the merge
    /// base of BASE and HEAD to HEAD: added, modified or removed. A change to
    /// a series.toml lists every revision of that series.
    Changed {
        /// The commit the changes are measured from (a branch, tag or commit id)
        #[arg(long, value_name = "REF")]
        base: String,
        /// The commit with the changes
        #[arg(long, value_name = "REF", default_value = "HEAD")]
        head: String,
        /// The git repository holding patches/
        #[arg(long, value_name = "DIR", default_value = ".")]
        repo: PathBuf,
        /// Print JSON instead of text
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum GuestCommand {
    /// Build (or reuse) the farm guest's initramfs, content addressed in
    /// <cache>/guest/farm-<hash>.cpio; prints its path
    Image {
        /// Also copy it here
        #[arg(short = 'o', long = "out", value_name = "PATH")]
        out: Option<PathBuf>,
        /// A statically linked phyfarm-agent to use instead of building one
        #[arg(long, value_name = "PATH")]
        agent: Option<PathBuf>,
    },
    /// Resolve, once, what every farm guest needs: the kernels (--kernel,
    /// --artifacts, or --default-kernels), the emulator and the exporter
    /// guest's kernel (as --device needs), the guest image (built or
    /// reused), the accelerator (auto: KVM only if a short probe
    /// boot of the first kernel finishes, else TCG, with the reason; kept for
    /// this host boot) and the QEMU machine for it. The farm's pytest plugin
    /// starts from this (`phyfarm test` hands it over as a file)
    Plan {
        /// Accelerator: auto probes KVM with a short boot of the first kernel
        /// and falls back to TCG
        #[arg(long, value_enum, default_value = "auto")]
        accel: Accel,
        /// One kernel for the farm (its variant: the --variant given once,
        /// else its metadata.json's, else rust)
        #[arg(long, value_name = "PATH", conflicts_with_all = ["artifacts", "default_kernels"])]
        kernel: Option<PathBuf>,
        /// A build's output folder: DIR/bzImage or DIR/<variant>/bzImage
        #[arg(long, value_name = "DIR", conflicts_with = "default_kernels")]
        artifacts: Option<PathBuf>,
        /// The cache's kernels (<cache>/out/<variant>), built when missing
        #[arg(long)]
        default_kernels: bool,
        /// Variants to resolve kernels for (repeatable) [default: rust and c]
        #[arg(long, value_enum)]
        variant: Vec<Variant>,
        /// This guest image instead of the one phyfarm builds
        #[arg(long, value_name = "PATH")]
        image: Option<PathBuf>,
        /// This ax88772-emu binary
        #[arg(long, value_name = "PATH", conflicts_with = "build_emulator")]
        emulator: Option<PathBuf>,
        /// Build ax88772-emu (release) and use it
        #[arg(long)]
        build_emulator: bool,
        /// The farm's adapter, which decides what is built: emulated (the
        /// emulator), forwarded-gadget (the emulator and the exporter kernel)
        /// or forwarded:HOST:PORT (neither) [default: neither, unless asked
        /// for below]
        #[arg(long, value_name = "DEVICE", value_parser = parse_device)]
        device: Option<String>,
        /// The exporter guest's kernel (the forwarded-gadget path)
        #[arg(long, value_name = "PATH", conflicts_with = "build_exporter_kernel")]
        exporter_kernel: Option<PathBuf>,
        /// Build the exporter guest's kernel (<cache>/out/exporter: the c
        /// variant with qemu-farm/guest/exporter.config; incremental) and use it
        #[arg(long)]
        build_exporter_kernel: bool,
        /// Print JSON instead of text
        #[arg(long)]
        json: bool,
    },
    /// Print the variants a farm run with these options covers, one per
    /// line, building nothing: the variant of --kernel (the --variant given
    /// once, else its metadata.json's, else rust), those found in
    /// --artifacts, else the --variants given, else rust and c. The farm's
    /// pytest plugin asks this to parametrize its checks
    Variants {
        /// One kernel for the farm
        #[arg(long, value_name = "PATH", conflicts_with = "artifacts")]
        kernel: Option<PathBuf>,
        /// A build's output folder: DIR/bzImage or DIR/<variant>/bzImage
        #[arg(long, value_name = "DIR")]
        artifacts: Option<PathBuf>,
        /// Variants asked for (repeatable) [default: rust and c]
        #[arg(long, value_enum)]
        variant: Vec<Variant>,
    },
    /// Print the QEMU machine every phyfarm guest is (the one `phyfarm boot`
    /// runs, confined: -sandbox, and as root the drop to the QEMU user), with
    /// the slots {kernel}, {initrd}, {memory}, {append} and {console} for the
    /// farm to fill per guest. --json adds the kernel command line every
    /// guest starts {append} with, the firmware (qboot when QEMU ships it,
    /// else seabios), the confinement, the QEMU user, QEMU's version and its
    /// reconnecting-chardev option
    Machine {
        /// The accelerator, already resolved (the farm probes KVM first)
        #[arg(long, value_parser = resolved_accel, value_name = "kvm|tcg")]
        accel: Accel,
        /// Print JSON ({"argv": [...], "slots": [...]}) instead of a shell line
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Args)]
pub struct TestArgs {
    /// A build's output folder: OUT/bzImage + metadata.json, or
    /// OUT/<variant>/bzImage for a series build
    #[arg(long, value_name = "OUT", required_unless_present = "kernel")]
    pub artifacts: Option<PathBuf>,
    /// One kernel image instead of --artifacts
    #[arg(long, value_name = "PATH", conflicts_with = "artifacts")]
    pub kernel: Option<PathBuf>,
    /// Only this variant
    #[arg(long, value_enum)]
    pub variant: Option<Variant>,
    /// Parallel guests (pytest-xdist workers) [default: one]
    #[arg(short = 'n', long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=256))]
    pub workers: Option<u16>,
    /// Only the checks matching this pytest -k expression
    #[arg(short = 'k', value_name = "EXPR")]
    pub keyword: Option<String>,
    /// Accelerator: auto probes KVM with a short boot and falls back to TCG
    #[arg(long, value_enum, default_value = "auto", env = "PHYFARM_ACCEL")]
    pub accel: Accel,
    /// Seconds a guest may take for one step before the check is ERROR
    #[arg(long, default_value_t = 120, value_name = "SECS")]
    pub guest_timeout: u64,
    /// Link flaps per link-flap check [default: 20]
    #[arg(long, value_name = "N")]
    pub flaps: Option<u32>,
    /// emulated (ax88772-emu), forwarded-gadget (ax88772-emu as a USB gadget in an exporter
    /// guest, exported by the real usbredirect) or forwarded:HOST:PORT (a usbredirect'ed adapter)
    #[arg(long, value_name = "DEVICE", value_parser = parse_device)]
    pub device: Option<String>,
    /// The ax88772-emu binary to serve the emulated adapter [default: built from
    /// qemu-farm/ax88772 with `cargo build --release`]
    #[arg(long, value_name = "PATH")]
    pub emulator: Option<PathBuf>,
    /// Output folder for junit.xml, results.json and logs [default: <cache>/runs/test-...]
    #[arg(short = 'o', long = "out", value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Extra pytest arguments (after --)
    #[arg(last = true, value_name = "PYTEST_ARGS")]
    pub pytest_args: Vec<String>,
}

#[derive(Debug, Args)]
pub struct ReproArgs {
    /// `<series-name>/v<N>`: the revision whose run to reproduce from
    pub revision: crate::results::RevisionRef,
    /// The check id as the verdict names it: `farm.link_flap[plain]`,
    /// `farm.kunit.<case>`
    pub check: String,
    /// The variant to rerun it on [default: the one where it did not pass]
    #[arg(long, value_enum)]
    pub variant: Option<Variant>,
    /// The run folder (`phyfarm run -o`) [default: where the store's
    /// latest run of the revision keeps its logs, else <cache>/runs/<series>-v<N>]
    #[arg(long, value_name = "DIR")]
    pub run: Option<PathBuf>,
    /// Rerun the check on the unpatched base's kernels of that run
    #[arg(long)]
    pub base: bool,
    /// After the check, a shell in the guest (busybox sh, a line at a time)
    /// with the adapter still attached; `:help` lists the emulator's commands
    #[arg(long)]
    pub shell: bool,
    /// Output folder [default: <run>/repro/<time>]
    #[arg(short = 'o', long = "out", value_name = "DIR")]
    pub out: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct ImagesArgs {
    /// Only this image (and what it is built on); repeatable
    #[arg(long, value_enum)]
    pub only: Vec<ImageKind>,
    /// Print the commands instead of running them
    #[arg(long)]
    pub dry_run: bool,
}

#[derive(Debug, Args)]
pub struct BuildArgs {
    /// rust: CONFIG_AX88796B_RUST_PHY=y; c: the C PHY driver [required
    /// without --series; with --series, both unless given]
    #[arg(long, value_enum)]
    pub variant: Option<Variant>,
    /// Build a series revision patch by patch (a directory of format-patch
    /// files or an mbox), with the Rust gates on the result
    #[arg(long, value_name = "DIR")]
    pub series: Option<PathBuf>,
    /// With --series: skip the Rust gates (rustfmtcheck, enum-check, clippy, rustdoc)
    #[arg(long, requires = "series")]
    pub no_gates: bool,
    /// Output directory for bzImage, .config, build.log, metadata.json
    /// [default: <cache>/out/<variant>, or <cache>/out/series-v<N> with --series]
    #[arg(short = 'o', long = "out", value_name = "OUT")]
    pub out: Option<PathBuf>,
    /// Parallel make jobs [default: number of CPUs]
    #[arg(short = 'j', long)]
    pub jobs: Option<usize>,
    /// Extra kernel option on top of the fragments, e.g. -K CONFIG_KUNIT=y
    #[arg(short = 'K', long = "kconfig", value_name = "CONFIG_X=VAL")]
    pub kconfig: Vec<String>,
    /// A fragment file's options as -K options, before those given with -K
    /// (repeatable), e.g. qemu-farm/guest/exporter.config
    #[arg(long, value_name = "FILE")]
    pub kconfig_fragment: Vec<PathBuf>,
    /// Print the exact commands instead of running them
    #[arg(long)]
    pub dry_run: bool,
}

#[derive(Debug, Args)]
pub struct BootArgs {
    /// The kernel image to boot (OUT/bzImage of `phyfarm build`)
    #[arg(long, value_name = "PATH")]
    pub kernel: PathBuf,
    #[command(flatten)]
    pub guest: GuestArgs,
    /// Which PHY driver must be attached [default: the variant in the
    /// metadata.json beside the kernel]
    #[arg(long, value_enum)]
    pub expect_variant: Option<Variant>,
    /// Output directory for console.log and boot.json [default: <cache>/runs/boot-...]
    #[arg(short = 'o', long = "out", value_name = "DIR")]
    pub out: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct GuestArgs {
    /// Accelerator: auto probes KVM with a short boot and falls back to TCG
    #[arg(long, value_enum, default_value = "auto", env = "PHYFARM_ACCEL")]
    pub accel: Accel,
    /// Seconds a guest may run before it is killed (reported as ERROR)
    #[arg(long, default_value_t = 120, value_name = "SECS")]
    pub timeout: u64,
    /// Guest memory in MiB
    #[arg(long, default_value_t = machine::DEFAULT_MEMORY_MB, value_name = "MIB")]
    pub memory: u32,
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// The series revision to run (a directory of format-patch files or an
    /// mbox) [default: the newest revision of patches/rust-phy-enum-check]
    #[arg(value_name = "DIR")]
    pub series: Option<PathBuf>,
    /// Output folder [default: <cache>/runs/<series>-v<N>]
    #[arg(short = 'o', long = "out", value_name = "OUT")]
    pub out: Option<PathBuf>,
    /// Skip the Rust gates
    #[arg(long)]
    pub no_gates: bool,
    /// Skip the farm's checks (builds, gates and boot checks only)
    #[arg(long)]
    pub no_farm: bool,
    /// Skip the KUnit configuration: no KUnit build of the patched tree and
    /// no farm.kunit (the Rust doctests and KUnit suites) in the plan
    #[arg(long)]
    pub no_kunit: bool,
    /// Run the base's farm checks even when an earlier run had the same
    /// base kernels, farm code and plan (their results are reused otherwise;
    /// the base's throughput is always measured again)
    #[arg(long)]
    pub fresh_base: bool,
    /// The ax88772-emu binary to serve the emulated adapter, on the base and
    /// the revision alike (the base's results are reused only from a run
    /// with the same binary) [default: built from qemu-farm/ax88772 with
    /// `cargo build --release`]
    #[arg(long, value_name = "PATH")]
    pub emulator: Option<PathBuf>,
    /// Link flaps per link-flap check
    #[arg(long, value_name = "N")]
    pub flaps: Option<u32>,
    /// Variants to build and boot
    #[arg(long, value_enum, value_delimiter = ',', default_value = "rust,c")]
    pub variants: Vec<Variant>,
    /// Plan only these farm checks (families such as farm.link_flap; see
    /// `phyfarm farm plan`) [default: every check]
    #[arg(long, value_delimiter = ',', value_name = "CHECK")]
    pub checks: Vec<String>,
    /// Parallel make jobs [default: number of CPUs]
    #[arg(short = 'j', long)]
    pub jobs: Option<usize>,
    /// Parallel farm guests (pytest-xdist workers) [default: twice the
    /// number of CPUs plus one: the checks spend most of their time waiting
    /// on the guest's PHY polling, link timers and the emulated PHY's
    /// 1.5-3 s autonegotiation, so more guests than cores keep them busy]
    #[arg(short = 'n', long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=256))]
    pub workers: Option<u16>,
    /// A pull request's revision on the trusted runner: the default
    /// branch's patches/ folder. A series it holds (same folder, name or
    /// change-id) gets revisions only from the `owners` of its series.toml
    /// there (with --author), and a revision a newer one supersedes in the
    /// store is refused; both before anything is built
    #[arg(long, value_name = "DIR", requires = "author")]
    pub owners_from: Option<PathBuf>,
    /// Who opened the pull request, `github:<login>` (with --owners-from)
    #[arg(long, value_name = "WHO", requires = "owners_from")]
    pub author: Option<String>,
    #[command(flatten)]
    pub guest: GuestArgs,
}

#[derive(Debug, Args)]
pub struct SandboxMakeArgs {
    /// The tree (mounted read-write at /build; `make -C /build` runs there)
    #[arg(long, value_name = "DIR")]
    pub tree: PathBuf,
    /// Output folder: build.log and the copied artifacts
    #[arg(short, long, value_name = "OUT")]
    pub out: PathBuf,
    /// Make targets
    #[arg(value_name = "TARGET")]
    pub targets: Vec<String>,
}
