//! The command line: make-like verbs over the library.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Result;
use clap::{Args, Parser, Subcommand};

use crate::accel::Accel;
use crate::config::{Paths, Variant};
use crate::images::{self, human_size, ImageKind};
use crate::runtime::{shell_quote, Runtime};
use crate::{boot, doctor, kernel, progress, Outcome};

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
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Check every host prerequisite and print each problem with its fix
    Doctor,
    /// Build the container images (base, kbuild, farm) if their inputs changed
    Images(ImagesArgs),
    /// Build the distro kernel for one variant
    Build(BuildArgs),
    /// Boot a kernel in QEMU and check the asix and AX88772A PHY drivers from inside
    Boot(BootArgs),
    /// Images, both builds and both boots: the main job end to end
    Run(RunArgs),
    /// Patch series: parse and show what phyfarm sees
    #[command(subcommand)]
    Series(SeriesCommand),
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
    /// rust: CONFIG_AX88796B_RUST_PHY=y; c: the C PHY driver
    #[arg(long, value_enum)]
    pub variant: Variant,
    /// Output directory for bzImage, .config, build.log, metadata.json
    /// [default: <cache>/out/<variant>]
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
    #[arg(long, default_value_t = 256, value_name = "MIB")]
    pub memory: u32,
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// Variants to build and boot
    #[arg(long, value_enum, value_delimiter = ',', default_value = "rust,c")]
    pub variants: Vec<Variant>,
    /// Parallel make jobs [default: number of CPUs]
    #[arg(short = 'j', long)]
    pub jobs: Option<usize>,
    #[command(flatten)]
    pub guest: GuestArgs,
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
    let paths = Paths::resolve(cli.global.cache.clone())?;
    let runtime = cli.global.runtime;
    match cli.command {
        Command::Doctor => {
            let ok = doctor::report(&doctor::check(&paths));
            Ok(if ok { Outcome::Pass } else { Outcome::Error })
        }
        Command::Images(a) => images_cmd(&paths, runtime, a),
        Command::Build(a) => {
            let opts = kernel::BuildOptions {
                variant: a.variant,
                out: a.out.unwrap_or_else(|| paths.out_default(a.variant)),
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
        Command::Run(a) => run_cmd(&paths, runtime, a),
        Command::Series(SeriesCommand::Show { path, json }) => {
            let s = crate::series::load(&path)?;
            let text = if json {
                serde_json::to_string_pretty(&s)? + "\n"
            } else {
                crate::series::render_text(&s)
            };
            print_stdout(&text)?;
            Ok(Outcome::Pass)
        }
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

fn run_cmd(paths: &Paths, runtime: Runtime, a: RunArgs) -> Result<Outcome> {
    let mut worst = Outcome::Pass;
    let mut lines = Vec::new();
    for v in &a.variants {
        let out = paths.out_default(*v);
        let opts = kernel::BuildOptions {
            variant: *v,
            out: out.clone(),
            runtime,
            jobs: jobs(a.jobs),
            dry_run: false,
            extra: vec![],
            reproducer: format!("phyfarm build --variant {v} -o {}", out.display()),
        };
        let built = kernel::build(paths, &opts)?;
        if built != Outcome::Pass {
            worst = Outcome::Fail;
            lines.push(format!(
                "{v}: build FAIL, see {}",
                out.join("build.log").display()
            ));
            continue;
        }
        let boot_out = out.join("boot");
        let bopts = boot_options(
            out.join("bzImage"),
            &a.guest,
            Some(boot_out.clone()),
            Some(*v),
            runtime,
        );
        let repro = format!("phyfarm boot --kernel {}", out.join("bzImage").display());
        let booted = boot::boot(paths, &bopts, &repro)?;
        if booted != Outcome::Pass {
            worst = Outcome::Fail;
        }
        lines.push(format!(
            "{v}: build PASS, boot {}: kernel {}, boot log {}",
            if booted == Outcome::Pass {
                "PASS"
            } else {
                "FAIL"
            },
            out.join("bzImage").display(),
            boot_out.join("console.log").display()
        ));
    }
    for l in lines {
        println!("{l}");
    }
    Ok(worst)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_is_well_formed() {
        Cli::command().debug_assert();
    }

    #[test]
    fn unknown_variant_is_a_usage_error() {
        let err = Cli::try_parse_from(["phyfarm", "build", "--variant", "go"]).unwrap_err();
        assert_eq!(err.exit_code(), 2);
        assert!(err.to_string().contains("invalid value 'go'"), "{err}");
    }

    #[test]
    fn run_defaults_to_both_variants() {
        let cli = Cli::try_parse_from(["phyfarm", "run"]).unwrap();
        match cli.command {
            Command::Run(a) => assert_eq!(a.variants, [Variant::Rust, Variant::C]),
            other => panic!("{other:?}"),
        }
    }
}
