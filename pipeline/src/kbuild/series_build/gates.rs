//! The Rust gates of a series build (rustfmtcheck, the enum exhaustiveness
//! check, rustdoc, clippy) and the KUnit build, on the fully patched tree
//! of the rust variant. Which gates run is decided by [`gate_scope`].

use std::fs::File;
use std::io::Write;
use std::path::Path;
use std::time::Instant;

use anyhow::Result;

use super::{Ctx, Gate, PatchBuild, KUNIT_GATE, KUNIT_OPTIONS};
use crate::config::{Paths, Variant};
use crate::ingest::series::Series;
use crate::kbuild::gate_scope;
use crate::kbuild::kernel::{self, Layout, KBUILD_MAKE};
use crate::kbuild::metadata::{self, Status};
use crate::progress::{info, printable, warn};
use crate::run_folder::RunFolder;

/// The file the series' enum exhaustiveness pass generates; the gate removes
/// it so the check really runs again, then builds the rust/ directory.
pub const ENUM_CHECK_OUTPUT: &str = "bindings/bindings_generated_enum_check.rs";

/// The Rust gates, in the order they run. rustdoc comes before clippy: it
/// reuses the crates the builds left, where a clippy build would leave them
/// to be compiled again.
pub const GATES: [&str; 4] = ["rustfmtcheck", "enum-check", "rustdoc", "clippy"];

/// Make targets of a gate (None: the gate does not apply to this tree).
pub fn gate_target(name: &str, jobs: usize, tree: &Path) -> Option<Vec<String>> {
    let j = format!("-j{jobs}");
    let base = |extra: &[&str]| {
        let mut v: Vec<String> = KBUILD_MAKE.iter().map(|s| s.to_string()).collect();
        v.extend(extra.iter().map(|s| s.to_string()));
        v
    };
    match name {
        "rustfmtcheck" => Some(base(&["rustfmtcheck"])),
        "clippy" => Some(base(&["CLIPPY=1", &j, "bzImage"])),
        "rustdoc" => Some(base(&[&j, "rustdoc"])),
        "enum-check" => {
            // The patched tree: read without following links.
            let mk = crate::sandbox::safe_fs::read_in(tree, Path::new("rust/Makefile"), 1 << 20)
                .map(|b| String::from_utf8_lossy(&b).into_owned())
                .unwrap_or_default();
            mk.contains(ENUM_CHECK_OUTPUT).then(|| base(&[&j, "rust/"]))
        }
        _ => None,
    }
}

/// The Rust gates, each run only when the series can affect it.
pub(super) fn rust_gates(
    ctx: &Ctx,
    s: &Series,
    builds: &[PatchBuild],
    broken: bool,
) -> Result<Vec<Gate>> {
    if broken {
        return Ok(GATES
            .map(|g| skipped(g, "the series does not apply"))
            .to_vec());
    }
    let mut gates = Vec::new();
    let unbuilt = builds
        .iter()
        .any(|b| b.variant == Variant::Rust && b.status != Status::Pass);
    let scopes = gate_scopes(ctx.paths, &ctx.tc.kernel_version, s);
    for (g, scope) in GATES.into_iter().zip(&scopes) {
        if !scope.runs {
            info(&format!("[gate {g}] SKIP: {}", printable(&scope.reason)));
            gates.push(skipped(g, &scope.reason));
            continue;
        }
        if unbuilt && matches!(g, "clippy" | "rustdoc") {
            gates.push(skipped(g, "the series does not build"));
            continue;
        }
        gates.push(run_gate(ctx, g)?);
    }
    Ok(gates)
}

fn skipped(name: &str, why: &str) -> Gate {
    Gate {
        name: name.to_string(),
        status: "SKIP".into(),
        seconds: 0.0,
        message: why.to_string(),
        log: String::new(),
        log_excerpt: vec![],
    }
}

/// Which gates the series can affect, from the dependency records of the
/// base build it starts from (see `gate_scope`).
pub fn gate_scopes(paths: &Paths, kernel_version: &str, s: &Series) -> Vec<gate_scope::Scope> {
    let touched: Vec<String> = s
        .patches
        .iter()
        .flat_map(|p| p.files_touched.iter().cloned())
        .collect();
    let base = Layout::new(paths, kernel_version, Variant::Rust).build;
    let deps = match gate_scope::RustDeps::read(&base) {
        Ok(d) if !d.crates.is_empty() => Some(d),
        Ok(_) => {
            warn(&format!(
                "{} has no Rust dependency records: every Rust gate runs",
                base.display()
            ));
            None
        }
        Err(e) => {
            warn(&format!("{e:#}: every Rust gate runs"));
            None
        }
    };
    gate_scope::decide(&GATES, &touched, deps.as_ref())
}

fn run_gate(ctx: &Ctx, name: &str) -> Result<Gate> {
    let log_path = RunFolder::new(&ctx.opts.out)
        .logs()
        .join(format!("gate-{name}.log"));
    std::fs::create_dir_all(log_path.parent().unwrap())?;
    let mut gate = Gate {
        name: name.to_string(),
        status: "SKIP".into(),
        seconds: 0.0,
        message: String::new(),
        log: log_path.display().to_string(),
        log_excerpt: vec![],
    };
    let Some(argv) = gate_target(name, ctx.opts.jobs, &ctx.trees.work) else {
        gate.message = "the tree has no enum exhaustiveness check".into();
        return Ok(gate);
    };
    let mut log = File::create(&log_path)?;
    writeln!(log, "# reproduce: {}", ctx.opts.reproducer)?;
    if name == "enum-check" {
        let out = ctx
            .series_build_dir(Variant::Rust)
            .join("rust")
            .join(ENUM_CHECK_OUTPUT);
        match std::fs::remove_file(&out) {
            Ok(()) => writeln!(log, "# removed {} so the check runs again", out.display())?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e.into()),
        }
    }
    let t = Instant::now();
    let mut run = ctx.run(&mut log, &format!("[gate {name}]"));
    let failed = run.job(&ctx.make_job(Variant::Rust, &argv), name)?;
    let stopped = run.stopped.take();
    drop(run);
    gate.seconds = t.elapsed().as_secs_f64();
    drop(log);
    let text = std::fs::read_to_string(&log_path).unwrap_or_default();
    gate.status = if failed.is_none() { "PASS" } else { "FAIL" }.into();
    if failed.is_some() {
        gate.log_excerpt = metadata::error_excerpt(&text, 20);
        gate.message = gate.log_excerpt.first().cloned().unwrap_or_default();
        if let Some(l) = text.lines().find(|l| l.contains("not covered")) {
            gate.message = l
                .trim()
                .trim_start_matches(['|', '^', '_', ' '])
                .to_string();
        }
        if let Some(why) = stopped {
            gate.message = format!("phyfarm stopped the gate: {why}");
        }
    }
    info(&format!(
        "[gate {name}] {} in {:.0}s",
        gate.status, gate.seconds
    ));
    Ok(gate)
}

/// Build the KUnit configuration of the fully patched tree (rust variant),
/// incrementally from the base's KUnit build tree.
pub(super) fn kunit_build(ctx: &Ctx, rust_built: bool) -> Result<Gate> {
    let log_path = RunFolder::new(&ctx.opts.out).logs().join("kunit-build.log");
    std::fs::create_dir_all(log_path.parent().unwrap())?;
    let mut gate = Gate {
        name: KUNIT_GATE.to_string(),
        status: "SKIP".into(),
        seconds: 0.0,
        message: String::new(),
        log: log_path.display().to_string(),
        log_excerpt: vec![],
    };
    if !rust_built {
        gate.message = "the series does not build in the rust variant".into();
        return Ok(gate);
    }
    let mut log = File::create(&log_path)?;
    writeln!(log, "# reproduce: {}", ctx.opts.reproducer)?;
    writeln!(
        log,
        "# the patched tree with -K {}",
        KUNIT_OPTIONS.join(" -K ")
    )?;
    let argv = kernel::bzimage_argv(ctx.opts.jobs);
    let t = Instant::now();
    let mut run = ctx.run(&mut log, "[rust-kunit]");
    let failed = run.job(
        &ctx.make_job_in(&ctx.kunit_build_dir(), &argv),
        "make bzImage",
    )?;
    let stopped = run.stopped.take();
    drop(run);
    gate.seconds = t.elapsed().as_secs_f64();
    drop(log);
    gate.status = if failed.is_none() { "PASS" } else { "FAIL" }.into();
    if failed.is_some() {
        let text = std::fs::read_to_string(&log_path).unwrap_or_default();
        gate.log_excerpt = metadata::error_excerpt(&text, 20);
        gate.message = match stopped {
            Some(why) => format!("phyfarm stopped the build: {why}"),
            None => gate.log_excerpt.first().cloned().unwrap_or_default(),
        };
    }
    info(&format!(
        "[rust-kunit] build {} in {:.0}s",
        gate.status, gate.seconds
    ));
    Ok(gate)
}
