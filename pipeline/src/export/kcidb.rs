//! KCIDB v5 (schema 5.3) JSON: one checkout per run (the revision's runs
//! with `patchset_files`, `patchset_hash` and `message_id`; the base run with
//! an empty patchset), its builds, and its tests, measurements as DONE tests
//! with a `number`.
//!
//! Apply results are a property of the checkout (`valid: false` and the
//! log excerpt when a patch does not apply), as KCIDB models them.

use serde_json::{json, Map, Value};

use super::{url_segment, Bundle};
use crate::results::{tail_excerpt, Run, Status, MAX_EXCERPT_BYTES};

pub const ORIGIN: &str = "phyfarm";

fn id(parts: &[&str]) -> String {
    format!("{ORIGIN}:{}", parts.join(":"))
}

fn excerpt(s: &str) -> String {
    tail_excerpt(&s.replace('\0', ""), MAX_EXCERPT_BYTES).to_string()
}

/// Insert `v` under `k` unless it is empty.
fn put(m: &mut Map<String, Value>, k: &str, v: impl Into<Value>) {
    let v = v.into();
    let empty = matches!(&v, Value::String(s) if s.is_empty()) || v.is_null();
    if !empty {
        m.insert(k.to_string(), v);
    }
}

fn checkout(b: &Bundle, run: &Run, patched: bool) -> Value {
    let mut m = Map::new();
    put(&mut m, "id", id(&[&run.id]));
    put(&mut m, "origin", ORIGIN);
    put(&mut m, "start_time", run.started.to_string());
    let mut misc = json!({
        "base": run.base,
        "accelerator": run.environment.accelerator,
        "host": run.environment.host,
        "tools": run.environment.tools,
        "reproducer": run.reproducer,
    });
    if let Some(f) = run.finished {
        put(&mut m, "origin_tests_finish_time", f.to_string());
    }
    if patched {
        let info = &b.revision.info;
        if let Some(tree) = &info.tree {
            put(&mut m, "tree_name", tree.as_str());
        }
        let files: Vec<Value> = info
            .patches
            .iter()
            .filter(|p| !p.file.is_empty())
            .map(|p| json!({"name": p.file, "url": format!("{}/{}", b.target_url(), url_segment(&p.file))}))
            .collect();
        m.insert("patchset_files".into(), Value::Array(files));
        put(&mut m, "patchset_hash", info.patchset_hash.as_str());
        if let Some(mid) = info.message_id.as_deref().filter(|m| m.contains('@')) {
            put(&mut m, "message_id", mid);
        }
        put(
            &mut m,
            "comment",
            format!("{} ({} patches)", info.reference(), info.patches.len()),
        );
        let apply: Vec<_> = run
            .tests
            .iter()
            .filter(|t| t.path.starts_with("apply."))
            .collect();
        let failed: Vec<_> = apply.iter().filter(|t| t.status == Status::Fail).collect();
        if !apply.is_empty() {
            m.insert("valid".into(), Value::Bool(failed.is_empty()));
        }
        if let Some(f) = failed.first() {
            put(&mut m, "log_excerpt", excerpt(&f.log_excerpt));
        }
        misc["revision"] = json!(info.reference().to_string());
        misc["change_id"] = json!(info.change_id);
        misc["verdict"] = json!(b.report.state);
        if !b.report.first_bad.is_empty() {
            misc["first_bad"] = json!(b.report.first_bad);
        }
        misc["dashboard"] = json!(b.target_url());
    } else {
        // "" is meaningful: no patches applied.
        m.insert("patchset_hash".into(), json!(""));
        put(&mut m, "comment", format!("unpatched base {}", run.base));
    }
    m.insert("misc".into(), misc);
    Value::Object(m)
}

/// The build a test ran on: the last patch's build of its variant.
fn build_for(run: &Run, variant: Option<&str>) -> String {
    let variant = variant
        .map(str::to_string)
        .or_else(|| run.builds.first().map(|b| b.variant.clone()))
        .unwrap_or_else(|| "rust".into());
    let last = run
        .builds
        .iter()
        .filter(|b| b.variant == variant)
        .max_by_key(|b| b.patch.map_or(0, |p| p + 1));
    let path = last.map_or(format!("build.{variant}.base"), |b| b.path());
    id(&[&run.id, &path])
}

fn builds(run: &Run, out: &mut Vec<Value>) {
    for bld in &run.builds {
        let mut m = Map::new();
        put(&mut m, "checkout_id", id(&[&run.id]));
        put(&mut m, "id", id(&[&run.id, &bld.path()]));
        put(&mut m, "origin", ORIGIN);
        put(
            &mut m,
            "comment",
            match bld.patch {
                Some(n) => format!("{} kernel with patches 1..{n}", bld.variant),
                None => format!("{} kernel, unpatched base", bld.variant),
            },
        );
        m.insert("duration".into(), json!(bld.duration_s));
        put(&mut m, "architecture", run.environment.arch.as_str());
        put(&mut m, "config_name", bld.variant.as_str());
        put(&mut m, "log_excerpt", excerpt(&bld.log_excerpt));
        put(&mut m, "status", bld.status.name());
        m.insert(
            "misc".into(),
            json!({"patch": bld.patch, "warnings": bld.warnings, "new_warnings": bld.new_warnings, "log_path": bld.log_path}),
        );
        out.push(Value::Object(m));
    }
}

/// The tests of a run; `revision` (None for the base run) adds the
/// reproducer of each farm check that did not pass.
fn tests(run: &Run, revision: Option<&str>, out: &mut Vec<Value>) {
    let env = json!({
        "comment": format!("QEMU ({}) with an emulated ASIX AX88772A", run.environment.accelerator),
        "misc": {"accelerator": run.environment.accelerator, "host": run.environment.host},
    });
    for t in run.tests.iter().filter(|t| !t.path.starts_with("apply.")) {
        let variant = t.variant.as_deref().unwrap_or("any");
        let tid = id(&[&run.id, &t.path, variant, &t.attempt.to_string()]);
        let mut m = Map::new();
        put(&mut m, "build_id", build_for(run, t.variant.as_deref()));
        put(&mut m, "id", tid);
        put(&mut m, "origin", ORIGIN);
        put(&mut m, "path", t.path.as_str());
        m.insert("environment".into(), env.clone());
        put(&mut m, "status", t.status.name());
        if let Some(d) = t.duration_s {
            m.insert("duration".into(), json!(d));
        }
        put(&mut m, "log_excerpt", excerpt(&t.log_excerpt));
        let mut misc = json!({"attempt": t.attempt});
        if t.attempt > 0 {
            misc["retry_of"] = json!(id(&[&run.id, &t.path, variant, "0"]));
        }
        if let Some(cmd) = revision
            .filter(|_| t.status.not_passed())
            .and_then(|r| crate::results::repro_command(r, &t.path, t.variant.as_deref()))
        {
            misc["reproducer"] = json!(cmd);
        }
        m.insert("misc".into(), misc);
        out.push(Value::Object(m));
    }
    for ms in &run.measurements {
        let variant = ms.variant.as_deref().unwrap_or("any");
        let mut m = Map::new();
        put(&mut m, "build_id", build_for(run, ms.variant.as_deref()));
        put(
            &mut m,
            "id",
            id(&[&run.id, &ms.name, variant, "measurement"]),
        );
        put(&mut m, "origin", ORIGIN);
        put(&mut m, "path", ms.name.as_str());
        m.insert("environment".into(), env.clone());
        put(&mut m, "status", Status::Done.name());
        m.insert(
            "number".into(),
            json!({"value": ms.value, "unit": ms.unit, "prefix": "metric"}),
        );
        m.insert(
            "misc".into(),
            json!({"samples": ms.samples, "lower_is_better": ms.lower_is_better}),
        );
        out.push(Value::Object(m));
    }
}

/// The whole KCIDB document for a bundle.
pub fn export(b: &Bundle) -> Value {
    let mut checkouts = Vec::new();
    let mut all_builds = Vec::new();
    let mut all_tests = Vec::new();
    if let Some(base) = &b.base {
        checkouts.push(checkout(b, base, false));
        builds(base, &mut all_builds);
        tests(base, None, &mut all_tests);
    }
    let rev = b.revision.info.reference().to_string();
    for run in &b.runs {
        checkouts.push(checkout(b, run, true));
        builds(run, &mut all_builds);
        tests(run, Some(&rev), &mut all_tests);
    }
    json!({
        "version": {"major": 5, "minor": 3},
        "checkouts": checkouts,
        "builds": all_builds,
        "tests": all_tests,
    })
}
