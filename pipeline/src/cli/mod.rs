//! The command line: make-like verbs over the library. The verbs and their
//! options are in `args.rs` (the whole `--help` in one place); this file
//! dispatches them, `guest.rs` holds the `phyfarm guest` verbs, and the work
//! is in the stage modules.
//!
//! One file over 500 lines: the dispatch is one `match` over every verb, read
//! beside `args.rs`.

mod args;
pub mod doctor;
mod guest;
pub mod results;

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Result;

use crate::config::{Paths, Variant};
use crate::guest::accel::Accel;
use crate::guest::boot;
use crate::kbuild::images::{self, human_size, ImageKind};
use crate::kbuild::{kernel, series_build};
use crate::sandbox::runtime::{shell_quote, Runtime};
use crate::{progress, Outcome};

pub use args::*;

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

/// `phyfarm run`'s farm guests: twice the CPUs plus one unless given (the
/// guests mostly wait on link timers; measured on 2 cores with 1.5-3 s
/// autonegotiation, the farm of v8 took 200 s with 3 guests and 165 s with 5).
fn farm_workers(n: Option<u16>) -> usize {
    n.map_or_else(|| 2 * jobs(None) + 1, usize::from)
}

/// The run folders `phyfarm repro` looks in, best first: --run; the folder
/// where the store's latest run of the revision keeps the check's logs
/// (`<run>/farm/logs/<node>`); `<cache>/runs/<series>-v<N>`.
fn repro_run_folders(
    paths: &Paths,
    store: &std::path::Path,
    a: &ReproArgs,
) -> Result<Vec<PathBuf>> {
    if let Some(run) = &a.run {
        if !run.is_dir() {
            anyhow::bail!("--run {}: no such folder", run.display());
        }
        let results = crate::run_folder::RunFolder::new(run).results();
        if results.is_file() {
            let got = crate::results::Run::load(&results)?;
            let rev = got.revision.as_ref().map(|r| r.reference().to_string());
            if rev.as_deref() != Some(a.revision.to_string().as_str()) {
                anyhow::bail!(
                    "--run {}: its results are of {}, not {}",
                    run.display(),
                    rev.as_deref().unwrap_or("the unpatched base"),
                    a.revision
                );
            }
        }
        return Ok(vec![run.clone()]);
    }
    let mut found = vec![];
    let exists = crate::store::is_postgres(store) || store.is_file();
    if exists {
        let db = crate::store::open(store, crate::store::OpenMode::Existing)?;
        let runs = match db.runs(&a.revision) {
            Err(crate::store::StoreError::UnknownRevision(_)) => vec![],
            r => r?,
        };
        for rec in runs.iter().rev() {
            let logs = rec
                .run
                .tests
                .iter()
                .filter(|t| t.path == a.check)
                .filter(|t| {
                    a.variant
                        .map_or(true, |v| t.variant.as_deref() == Some(v.name()))
                })
                .filter_map(|t| t.log_path.as_deref());
            // <run>/farm/logs/<node>: three folders up.
            for l in logs {
                if let Some(run) = std::path::Path::new(l).ancestors().nth(3) {
                    if run.is_dir() && !found.iter().any(|f: &PathBuf| f == run) {
                        found.push(run.to_path_buf());
                    }
                }
            }
        }
    }
    let default = paths
        .runs_dir()
        .join(format!("{}-v{}", a.revision.series, a.revision.version));
    if default.is_dir() && !found.contains(&default) && !a.revision.series.contains('/') {
        found.push(default);
    }
    Ok(found)
}

// Long: one arm per subcommand, each turning its arguments into the options of the stage that does the work.
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
                if a.dry_run || !a.kconfig.is_empty() || !a.kconfig_fragment.is_empty() {
                    anyhow::bail!(
                        "--series cannot be combined with --dry-run, -K or --kconfig-fragment"
                    );
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
            let mut extra = Vec::new();
            for f in &a.kconfig_fragment {
                extra.extend(crate::kbuild::kconfig::as_options(
                    &crate::kbuild::kconfig::parse_fragment(f)?,
                ));
            }
            extra.extend(a.kconfig);
            let opts = kernel::BuildOptions {
                variant,
                out: a.out.unwrap_or_else(|| paths.out_default(variant)),
                runtime,
                jobs: jobs(a.jobs),
                dry_run: a.dry_run,
                extra,
                reproducer: reproducer(),
            };
            let outcome = kernel::build(&paths, &opts)?;
            if !opts.dry_run {
                // The last stdout line names the output folder, pass or fail.
                print_stdout(&format!("{}\n", opts.out.display()))?;
            }
            Ok(outcome)
        }
        Command::Boot(a) => {
            let opts = boot_options(a.kernel, &a.guest, a.out, a.expect_variant, runtime);
            boot::boot(&paths, &opts, &reproducer())
        }
        Command::Run(a) => run_cmd(&paths, runtime, cli.global.store.clone(), a),
        Command::SandboxMake(a) => {
            kernel::sandbox_make(&paths, runtime, &a.tree, &a.out, &a.targets, &reproducer())
        }
        Command::Guest(cmd) => guest::run(&paths, runtime, cmd),
        Command::Test(a) => {
            let opts = crate::farm::TestOptions {
                artifacts: a.artifacts,
                kernel: a.kernel,
                variant: a.variant,
                workers: a.workers.map(usize::from),
                keyword: a.keyword,
                accel: a.accel,
                guest_timeout: a.guest_timeout,
                flaps: a.flaps,
                device: a.device,
                emulator: a.emulator,
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
                    let name = crate::run::store_runs::series_name(&a.series)?;
                    paths
                        .runs_dir()
                        .join(format!("{name}-v{}-record", s.version))
                }
            };
            crate::run::record_parts(
                &out,
                &crate::store::store_path(cli.global.store.clone(), Some(paths.cache.clone()))?,
                &crate::run::RecordParts {
                    series: a.series,
                    builds: a.builds,
                    farms: a.farms,
                    base_farms: a.base_farms,
                    checks: a.checks,
                    owners: a.owners_from.zip(a.author),
                },
            )
        }
        Command::Repro(a) => {
            let store =
                crate::store::store_path(cli.global.store.clone(), Some(paths.cache.clone()))?;
            let mut folders = vec![];
            for run in repro_run_folders(&paths, &store, &a)? {
                let run = if a.base { run.join("base") } else { run };
                folders.extend(crate::farm::repro::farm_folders(&run));
            }
            crate::farm::repro::repro(
                &paths,
                &crate::farm::repro::Options {
                    revision: a.revision.to_string(),
                    check: a.check,
                    variant: a.variant,
                    folders,
                    shell: a.shell,
                    out: a.out,
                },
            )
        }
        Command::Selftest(a) => crate::run::selftest::run(
            &paths,
            &crate::run::selftest::Options {
                names: a.cases,
                quick: a.quick,
                out: selftest_out(&paths.cache, a.quick, a.out),
                jobs: a.jobs.into(),
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
        Command::Watch(a) => watch(&paths, &cli.global, &a.args),
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
            let scopes = crate::kbuild::series_build::gate_scopes(&paths, &tc.kernel_version, &s);
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

/// `phyfarm watch`: the mail path (mailing/phyfarm_mail) runs in the cache's
/// Python venv and calls this binary back for `run`, `review` and `verdict`.
fn watch(paths: &Paths, global: &Global, args: &[String]) -> Result<Outcome> {
    let python = std::env::var_os("PHYFARM_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| paths.cache.join("venv").join("bin").join("python"));
    if !python.is_file() {
        anyhow::bail!(
            "{} not found (PHYFARM_PYTHON, else the cache's venv): run containers/host-setup.sh",
            python.display()
        );
    }
    let mut cmd = std::process::Command::new(&python);
    cmd.arg("-m")
        .arg("phyfarm_mail")
        .args(args)
        .env("PYTHONPATH", paths.repo.join("mailing"))
        .env("PHYFARM_BIN", std::env::current_exe()?)
        .env("PHYFARM_CACHE", &paths.cache)
        .env(
            "PHYFARM_RUNTIME",
            format!("{:?}", global.runtime).to_lowercase(),
        );
    if let Some(store) = &global.store {
        cmd.env("PHYFARM_STORE", store);
    }
    use std::os::unix::process::CommandExt;
    let err = cmd.exec();
    Err(anyhow::anyhow!("running {}: {err}", python.display()))
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
    let mut kinds = if a.only.is_empty() {
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
    // The farm image before kbuild: what the farm builds from it (the guest
    // image) and the emulator's release build, both mostly CPU, then run
    // while the kbuild image mostly downloads packages.
    kinds.sort_by_key(|k| match k {
        ImageKind::Base => 0,
        ImageKind::Farm => 1,
        ImageKind::Kbuild => 2,
    });
    kinds.dedup();
    std::thread::scope(|s| {
        let mut farm_side = None;
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
            if k == ImageKind::Farm {
                farm_side = Some(s.spawn(|| build_farm_side(paths)));
            }
        }
        if let Some(h) = farm_side {
            let (guest, emulator) = h
                .join()
                .map_err(|_| anyhow::anyhow!("the guest image and emulator build panicked"))??;
            println!(
                "{:7} {:40} {:12} {:>8}  the agent, the gadget and {} programs",
                "guest",
                guest.path.display(),
                guest.sha256.get(..12).unwrap_or(&guest.sha256),
                human_size(guest.size_bytes),
                guest.programs.len()
            );
            println!("{:7} {}", "emulator", emulator.display());
        }
        Ok(Outcome::Pass)
    })
}

/// What every farm run needs from the farm image and the workspace: the
/// guest image and the emulator's release build (each a no-op when up to
/// date).
fn build_farm_side(paths: &Paths) -> Result<(crate::guest::image::ImageRecord, PathBuf)> {
    let emulator = crate::guest::plan::build_emulator(paths)?;
    let guest = crate::guest::image::image(paths, None, None)?;
    Ok((guest, emulator))
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
            what: format!(
                "{} needs the rust variant and the farm, without --no-kunit",
                crate::farm::contract::KUNIT_CHECK
            ),
        });
    }
    let farm = (!a.no_farm).then(|| crate::farm::TestOptions {
        artifacts: None,
        kernel: None,
        variant: None,
        workers: Some(farm_workers(a.workers)),
        keyword: None,
        accel: a.guest.accel,
        guest_timeout: a.guest.timeout,
        flaps: a.flaps,
        device: None,
        emulator: a.emulator,
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
            owners: a.owners_from.zip(a.author),
        },
    )
}

/// `phyfarm selftest`'s folder: `-o`, else `<cache>/selftest`, or
/// `<cache>/selftest-quick` for the quick cases, so that `make test` never
/// replaces the store of the last full self-test.
fn selftest_out(cache: &Path, quick: bool, out: Option<PathBuf>) -> PathBuf {
    out.unwrap_or_else(|| cache.join(if quick { "selftest-quick" } else { "selftest" }))
}

/// `--device`: emulated, forwarded-gadget or forwarded:HOST:PORT.
fn parse_device(s: &str) -> Result<String, String> {
    if s == "emulated" || s == crate::farm::FORWARDED_GADGET {
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
