//! The command line: make-like verbs over the library.
//!
//! One file over 500 lines: the clap definitions of every verb and their
//! dispatch, so the whole `--help` is reviewed in one place; the work is in
//! the stage modules.

pub mod doctor;
pub mod results;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Result;
use clap::{Args, Parser, Subcommand};

use crate::build::images::{self, human_size, ImageKind};
use crate::build::{kernel, series_build};
use crate::config::{Paths, Variant};
use crate::guest::accel::Accel;
use crate::guest::boot;
use crate::sandbox::runtime::{shell_quote, Runtime};
use crate::{progress, Outcome};

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
    /// Build the container images (base, kbuild, farm) if their inputs changed
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
    /// The farm check families the matrix planned [default: every check]
    #[arg(long, value_delimiter = ',', value_name = "CHECK")]
    pub checks: Vec<String>,
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
    /// [default: <cache>/selftest]
    #[arg(short = 'o', long = "out", value_name = "OUT")]
    pub out: Option<PathBuf>,
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
    /// --artifacts, or --default-kernels), the emulator, the guest image
    /// (built or reused), the accelerator (auto: KVM only if a short probe
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
        /// Print JSON instead of text
        #[arg(long)]
        json: bool,
    },
    /// Print the QEMU machine every phyfarm guest is (the one `phyfarm boot`
    /// runs, confined: -sandbox, and as root the drop to the QEMU user), with
    /// the slots {kernel}, {initrd}, {memory}, {append} and {console} for the
    /// farm to fill per guest. --json adds the confinement, the QEMU user,
    /// QEMU's version and its reconnecting-chardev option
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
    /// Parallel guests (pytest-xdist workers)
    #[arg(short = 'n', value_name = "N")]
    pub workers: Option<usize>,
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
    /// Output folder for junit.xml, results.json and logs [default: <cache>/runs/test-...]
    #[arg(short = 'o', long = "out", value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Extra pytest arguments (after --)
    #[arg(last = true, value_name = "PYTEST_ARGS")]
    pub pytest_args: Vec<String>,
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
    #[arg(long, default_value_t = boot::DEFAULT_MEMORY_MB, value_name = "MIB")]
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

/// The command line as typed, quoted, for reproducers.
pub fn reproducer() -> String {
    let mut args: Vec<String> = std::env::args().collect();
    if let Some(first) = args.first_mut() {
        *first = "phyfarm".into();
    }
    shell_quote(&args)
}

fn jobs(j: Option<usize>) -> usize {
    j.unwrap_or_else(|| {
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(2)
    })
}

pub fn run(cli: Cli) -> Result<Outcome> {
    if let Command::Results(cmd) = cli.command {
        return crate::cli::results::run(cli.global.store, cli.global.cache, cmd);
    }
    match &cli.command {
        Command::Serve(a) => return dashboard(&cli.global, "serve", &a.args),
        Command::Dashboard(DashboardCommand::Export(a)) => {
            return dashboard(&cli.global, "export", &a.args)
        }
        _ => {}
    }
    let paths = Paths::resolve(cli.global.cache.clone())?;
    let runtime = cli.global.runtime;
    match cli.command {
        Command::Doctor => {
            let ok = doctor::report(&doctor::check(&paths));
            Ok(if ok { Outcome::Pass } else { Outcome::Error })
        }
        Command::Images(a) => images_cmd(&paths, runtime, a),
        Command::Build(a) => {
            if let Some(dir) = a.series {
                if a.dry_run || !a.kconfig.is_empty() {
                    anyhow::bail!("--series cannot be combined with --dry-run or -K");
                }
                let variants = a.variant.map(|v| vec![v]).unwrap_or(Variant::ALL.to_vec());
                let out = match a.out {
                    Some(o) => o,
                    None => {
                        let s = crate::ingest::series::load(&dir)?;
                        paths
                            .cache
                            .join("out")
                            .join(format!("series-v{}", s.version))
                    }
                };
                let opts = series_build::SeriesBuildOptions {
                    dir,
                    variants,
                    out,
                    runtime,
                    jobs: jobs(a.jobs),
                    gates: !a.no_gates,
                    kunit: false,
                    reproducer: reproducer(),
                };
                return series_build::build_series(&paths, &opts);
            }
            let Some(variant) = a.variant else {
                anyhow::bail!("--variant rust|c is required (or --series DIR)");
            };
            let opts = kernel::BuildOptions {
                variant,
                out: a.out.unwrap_or_else(|| paths.out_default(variant)),
                runtime,
                jobs: jobs(a.jobs),
                dry_run: a.dry_run,
                extra: a.kconfig,
                reproducer: reproducer(),
            };
            kernel::build(&paths, &opts)
        }
        Command::Boot(a) => {
            let opts = boot_options(a.kernel, &a.guest, a.out, a.expect_variant, runtime);
            boot::boot(&paths, &opts, &reproducer())
        }
        Command::Run(a) => run_cmd(&paths, runtime, cli.global.store.clone(), a),
        Command::SandboxMake(a) => {
            kernel::sandbox_make(&paths, runtime, &a.tree, &a.out, &a.targets, &reproducer())
        }
        Command::Guest(GuestCommand::Machine { accel, json }) => {
            let text = if json {
                serde_json::to_string(&boot::machine_description(accel))? + "\n"
            } else {
                shell_quote(&boot::machine_template(accel)) + "\n"
            };
            print_stdout(&text)?;
            Ok(Outcome::Pass)
        }
        Command::Guest(GuestCommand::Plan {
            accel,
            kernel,
            artifacts,
            default_kernels,
            variant,
            image,
            emulator,
            build_emulator,
            json,
        }) => {
            use crate::guest::plan;
            let variants = if variant.is_empty() {
                Variant::ALL.to_vec()
            } else {
                variant.clone()
            };
            let kernels = if default_kernels {
                plan::default_kernels(&paths, runtime, &variants, jobs(None))?
            } else if kernel.is_some() || artifacts.is_some() {
                let opts = crate::farm::TestOptions {
                    kernel,
                    artifacts,
                    variant: (variant.len() == 1).then(|| variant[0]),
                    ..crate::farm::TestOptions::new(runtime)
                };
                crate::farm::kernels(&opts)?
                    .into_iter()
                    .filter(|(v, _)| variants.iter().any(|w| w.name() == v))
                    .collect()
            } else {
                vec![]
            };
            let req = plan::Request {
                accel,
                image,
                kernels,
                emulator: match (emulator, build_emulator) {
                    (Some(p), _) => plan::Emulator::Given(p),
                    (None, true) => plan::Emulator::Build,
                    (None, false) => plan::Emulator::None,
                },
            };
            let p = plan::resolve(&paths, runtime, &req)?;
            let text = if json {
                serde_json::to_string_pretty(&p)? + "\n"
            } else {
                let mut t = format!(
                    "guest image: {}\naccelerator: {} ({})\n",
                    p["guest_image"].as_str().unwrap_or(""),
                    p["accel"].as_str().unwrap_or(""),
                    p["accel_reason"].as_str().unwrap_or("")
                );
                for (v, k) in p["kernels"].as_object().into_iter().flatten() {
                    t += &format!("kernel {v}: {}\n", k.as_str().unwrap_or(""));
                }
                if let Some(e) = p["emulator"].as_str() {
                    t += &format!("emulator: {e}\n");
                }
                let machine: Vec<String> =
                    serde_json::from_value(p["machine"]["argv"].clone()).unwrap_or_default();
                t + &format!("machine: {}\n", shell_quote(&machine))
            };
            print_stdout(&text)?;
            Ok(Outcome::Pass)
        }
        Command::Guest(GuestCommand::Image { out, agent }) => {
            let rec = crate::guest::image::image(&paths, agent.as_deref(), out.as_deref())?;
            progress::info(&format!(
                "guest image {} ({}, agent {})",
                rec.sha256.get(..16).unwrap_or(""),
                images::human_size(rec.size_bytes),
                rec.agent
            ));
            println!("{}", rec.path.display());
            Ok(Outcome::Pass)
        }
        Command::Test(a) => {
            let opts = crate::farm::TestOptions {
                artifacts: a.artifacts,
                kernel: a.kernel,
                variant: a.variant,
                workers: a.workers,
                keyword: a.keyword,
                accel: a.accel,
                guest_timeout: a.guest_timeout,
                flaps: a.flaps,
                device: a.device,
                out: a.out,
                pytest_args: a.pytest_args,
                runtime,
            };
            crate::farm::test(&paths, &opts, &reproducer())
        }
        Command::Record(a) => {
            crate::farm::contract::keyword_for(&a.checks)?;
            let out = match a.out {
                Some(o) => o,
                None => {
                    let s = crate::ingest::series::load(&a.series)?;
                    let name = crate::run::record::series_name(&a.series);
                    paths
                        .runs_dir()
                        .join(format!("{name}-v{}-record", s.version))
                }
            };
            crate::run::record_parts(
                &out,
                &crate::store::store_path(cli.global.store.clone(), Some(paths.cache.clone()))?,
                &a.series,
                &a.builds,
                &a.farms,
                &a.checks,
            )
        }
        Command::Selftest(a) => crate::run::selftest::run(
            &paths,
            &crate::run::selftest::Options {
                names: a.cases,
                quick: a.quick,
                out: a.out.unwrap_or_else(|| paths.cache.join("selftest")),
            },
        ),
        Command::Farm(FarmCommand::Plan {
            variants,
            kunit,
            json,
        }) => {
            let names: Vec<&str> = crate::run::ordered(variants)
                .iter()
                .map(|v| v.name())
                .collect();
            let plan = crate::farm::contract::Plan::new(&names, kunit);
            let text = if json {
                serde_json::to_string_pretty(&plan)? + "\n"
            } else {
                plan.checks
                    .iter()
                    .map(|c| format!("{} {}\n", c.id, c.variant.as_deref().unwrap_or("-")))
                    .collect()
            };
            print_stdout(&text)?;
            Ok(Outcome::Pass)
        }
        // Dispatched above without a repository; kept for exhaustiveness.
        Command::Results(cmd) => crate::cli::results::run(cli.global.store, cli.global.cache, cmd),
        Command::Serve(a) => dashboard(&cli.global, "serve", &a.args),
        Command::Dashboard(DashboardCommand::Export(a)) => {
            dashboard(&cli.global, "export", &a.args)
        }
        Command::Series(SeriesCommand::Show { path, json }) => {
            let s = crate::ingest::series::load(&path)?;
            let text = if json {
                serde_json::to_string_pretty(&s)? + "\n"
            } else {
                crate::ingest::series::render_text(&s)
            };
            print_stdout(&text)?;
            Ok(Outcome::Pass)
        }
        Command::Series(SeriesCommand::Gates { path, json }) => {
            let s = crate::ingest::series::load(&path)?;
            let tc = kernel::toolchain(&paths, runtime, false)?;
            let scopes = crate::build::series_build::gate_scopes(&paths, &tc.kernel_version, &s);
            let text = if json {
                serde_json::to_string_pretty(&scopes)? + "\n"
            } else {
                scopes
                    .iter()
                    .map(|g| {
                        let verb = if g.runs { "runs" } else { "SKIP" };
                        format!(
                            "{:<13} {verb:<5} {}\n",
                            g.gate,
                            progress::printable(&g.reason)
                        )
                    })
                    .collect()
            };
            print_stdout(&text)?;
            Ok(Outcome::Pass)
        }
        Command::Series(SeriesCommand::Changed {
            base,
            head,
            repo,
            json,
        }) => {
            let c = crate::ingest::series_changed::changed(&repo, &base, &head)?;
            if json {
                print_stdout(&(serde_json::to_string_pretty(&c)? + "\n"))?;
            } else if c.revisions.is_empty() {
                progress::info(&format!("no series revision changed in {base}...{head}"));
            } else {
                print_stdout(&crate::ingest::series_changed::render_text(&c))?;
            }
            Ok(Outcome::Pass)
        }
    }
}

/// `phyfarm serve` and `phyfarm dashboard export`: exec `phyfarm-dashboard`
/// from beside this executable (the dashboards crate depends on this one,
/// so it cannot be linked in), with the store resolved here.
fn dashboard(global: &Global, verb: &str, args: &[String]) -> Result<Outcome> {
    let exe = std::env::current_exe()?;
    let bin = exe.with_file_name(format!("phyfarm-dashboard{}", std::env::consts::EXE_SUFFIX));
    if !bin.is_file() {
        anyhow::bail!(
            "{} not found beside {}: build it with `cargo build -p dashboards`",
            bin.display(),
            exe.display()
        );
    }
    let store = crate::store::store_path(global.store.clone(), global.cache.clone())?;
    use std::os::unix::process::CommandExt;
    let err = dashboard_command(&bin, &store, verb, args).exec();
    Err(anyhow::anyhow!("running {}: {err}", bin.display()))
}

/// The dashboard's command. The store goes in the environment, not on the
/// command line: a PostgreSQL URL may carry a password, and every user of
/// the machine can read a command line (`ps`).
fn dashboard_command(
    bin: &std::path::Path,
    store: &std::path::Path,
    verb: &str,
    args: &[String],
) -> std::process::Command {
    let mut cmd = std::process::Command::new(bin);
    cmd.env("PHYFARM_STORE", store).arg(verb).args(args);
    cmd
}

/// `--accel` where only an accelerator already resolved makes sense.
fn resolved_accel(s: &str) -> Result<Accel, String> {
    match s {
        "kvm" => Ok(Accel::Kvm),
        "tcg" => Ok(Accel::Tcg),
        _ => Err("expected kvm or tcg (resolve auto with `phyfarm guest plan`)".into()),
    }
}

/// Write to stdout; a closed pipe (`| head`) ends quietly instead of panicking.
fn print_stdout(text: &str) -> Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|_| out.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        r => Ok(r?),
    }
}

fn boot_options(
    kernel: PathBuf,
    g: &GuestArgs,
    out: Option<PathBuf>,
    expect: Option<Variant>,
    runtime: Runtime,
) -> boot::BootOptions {
    boot::BootOptions {
        kernel,
        accel: g.accel,
        timeout: Duration::from_secs(g.timeout),
        out,
        expect,
        runtime,
        memory_mb: g.memory,
    }
}

fn images_cmd(paths: &Paths, runtime: Runtime, a: ImagesArgs) -> Result<Outcome> {
    if runtime == Runtime::Host {
        progress::info("--runtime host uses no images; nothing to build");
        return Ok(Outcome::Pass);
    }
    let kinds = if a.only.is_empty() {
        vec![ImageKind::Base, ImageKind::Kbuild, ImageKind::Farm]
    } else {
        a.only
    };
    if a.dry_run {
        for k in kinds {
            images::dry_run(paths, k)?;
        }
        return Ok(Outcome::Pass);
    }
    for k in kinds {
        let info = images::ensure(paths, k)?;
        let key = match k {
            ImageKind::Kbuild => info
                .packages
                .get(images::LINUX_SOURCE_PACKAGE)
                .map(|v| format!("{} {v}", images::LINUX_SOURCE_PACKAGE)),
            ImageKind::Farm => info
                .packages
                .get("qemu-system-x86")
                .map(|v| format!("qemu {v}")),
            ImageKind::Base => info
                .packages
                .get("base-files")
                .map(|v| format!("base-files {v}")),
        }
        .unwrap_or_default();
        println!(
            "{:7} {:40} {:12} {:>8}  {key}",
            k.name(),
            info.tag,
            info.id.get(..12).unwrap_or(&info.id),
            human_size(info.size_bytes)
        );
    }
    Ok(Outcome::Pass)
}

fn run_cmd(paths: &Paths, runtime: Runtime, store: Option<PathBuf>, a: RunArgs) -> Result<Outcome> {
    let build = series_build::SeriesBuildOptions {
        dir: PathBuf::new(),
        variants: crate::run::ordered(a.variants.clone()),
        out: PathBuf::new(),
        runtime,
        jobs: jobs(a.jobs),
        gates: !a.no_gates,
        kunit: false,
        reproducer: reproducer(),
    };
    let boot = boot_options(PathBuf::new(), &a.guest, None, None, runtime);
    // The farm runs exactly the plan: the families asked for, else every
    // family, KUnit included (on the KUnit build of the patched tree) unless
    // --no-kunit or the run has no rust variant.
    let kunit_possible = !a.no_kunit && !a.no_farm && a.variants.contains(&Variant::Rust);
    let families = if a.checks.is_empty() {
        let mut f = crate::farm::contract::farm_families();
        if kunit_possible {
            f.push(crate::farm::contract::KUNIT_CHECK.to_string());
        }
        f
    } else {
        a.checks.clone()
    };
    // Checked here (a bad family is a usage error before anything runs);
    // the run picks each farm block's selection from its plan.
    crate::farm::contract::keyword_for(&families)?;
    let mut build = build;
    build.kunit = kunit_possible
        && families
            .iter()
            .any(|f| f == crate::farm::contract::KUNIT_CHECK);
    if !kunit_possible
        && families
            .iter()
            .any(|f| f == crate::farm::contract::KUNIT_CHECK)
    {
        anyhow::bail!(crate::farm::contract::ContractError::Invalid {
            file: "--checks".into(),
            what: "farm.kunit needs the rust variant and the farm, without --no-kunit".into(),
        });
    }
    let farm = (!a.no_farm).then(|| crate::farm::TestOptions {
        artifacts: None,
        kernel: None,
        variant: None,
        workers: Some(2),
        keyword: None,
        accel: a.guest.accel,
        guest_timeout: a.guest.timeout,
        flaps: a.flaps,
        device: None,
        out: None,
        pytest_args: vec![],
        runtime,
    });
    crate::run::run(
        paths,
        crate::run::RunOptions {
            store: crate::store::store_path(store, Some(paths.cache.clone()))?,
            dir: a.series,
            out: a.out,
            build,
            boot,
            farm,
            checks: a.checks,
            fresh_base: a.fresh_base,
        },
    )
}

/// `--device`: emulated, forwarded-gadget or forwarded:HOST:PORT.
fn parse_device(s: &str) -> Result<String, String> {
    if s == "emulated" || s == "forwarded-gadget" {
        return Ok(s.to_string());
    }
    if let Some(rest) = s.strip_prefix("forwarded:") {
        if let Some((host, port)) = rest.rsplit_once(':') {
            if !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p > 0) {
                return Ok(s.to_string());
            }
        }
    }
    Err("expected emulated, forwarded-gadget or forwarded:HOST:PORT".into())
}

#[cfg(test)]
mod tests;
