//! Which accelerator a guest runs under. `/dev/kvm` existing is not enough:
//! on some hosts (PVM) it opens and creates VMs, but ordinary guest kernels
//! hang. So a short probe boot decides, once per host boot, and TCG is the
//! fallback. Every result records which one ran.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::config::Paths;
use crate::jsonfile::{read_json, write_json_atomic};
use crate::progress::info;

/// `--accel`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Accel {
    /// Probe KVM with a short boot; use TCG if it cannot run the guest.
    Auto,
    Kvm,
    Tcg,
}

impl Accel {
    pub fn name(self) -> &'static str {
        match self {
            Accel::Auto => "auto",
            Accel::Kvm => "kvm",
            Accel::Tcg => "tcg",
        }
    }
}

/// How long the KVM probe boot may take before KVM is declared unusable.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(20);

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ProbeRecord {
    pub boot_id: String,
    pub kvm_usable: bool,
    pub reason: String,
}

fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// Whether /dev/kvm can be opened read-write at all.
pub fn kvm_device() -> Result<(), String> {
    match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
    {
        Ok(_) => Ok(()),
        Err(e) => Err(format!("/dev/kvm: {e}")),
    }
}

/// Whether the host runs KVM as PVM, which cannot run ordinary guests.
pub fn kvm_is_pvm() -> bool {
    std::fs::read_to_string("/proc/modules")
        .map(|m| m.lines().any(|l| l.starts_with("kvm_pvm ")))
        .unwrap_or(false)
}

/// The last recorded probe, if it was made during this host boot.
pub fn cached(paths: &Paths) -> Option<ProbeRecord> {
    let rec: ProbeRecord = read_json(&paths.cache.join("accel-probe.json")).ok()??;
    (rec.boot_id == boot_id()).then_some(rec)
}

/// Resolve `auto` to `kvm` or `tcg`. `probe` boots the given guest under KVM
/// and says whether it finished within the timeout.
pub fn resolve(
    paths: &Paths,
    want: Accel,
    probe: &dyn Fn(Duration) -> Result<bool, String>,
) -> (Accel, String) {
    resolve_with(paths, want, kvm_device(), probe)
}

/// `resolve`, with the KVM device check given (for tests).
pub fn resolve_with(
    paths: &Paths,
    want: Accel,
    device: Result<(), String>,
    probe: &dyn Fn(Duration) -> Result<bool, String>,
) -> (Accel, String) {
    if want != Accel::Auto {
        return (want, "requested".into());
    }
    if let Err(e) = device {
        return (Accel::Tcg, format!("no usable KVM device ({e})"));
    }
    if let Some(rec) = cached(paths) {
        let a = if rec.kvm_usable {
            Accel::Kvm
        } else {
            Accel::Tcg
        };
        return (a, format!("{} (probed earlier this boot)", rec.reason));
    }
    info(&format!(
        "probing KVM with a short boot (up to {}s)",
        PROBE_TIMEOUT.as_secs()
    ));
    let (usable, reason) = match probe(PROBE_TIMEOUT) {
        Ok(true) => (true, "KVM probe boot finished".to_string()),
        Ok(false) => (
            false,
            format!(
                "KVM probe boot did not finish in {}s{}",
                PROBE_TIMEOUT.as_secs(),
                if kvm_is_pvm() {
                    " (host KVM is PVM)"
                } else {
                    ""
                }
            ),
        ),
        Err(e) => (false, format!("KVM probe boot failed: {e}")),
    };
    let rec = ProbeRecord {
        boot_id: boot_id(),
        kvm_usable: usable,
        reason: reason.clone(),
    };
    let _ = write_json_atomic(&paths.cache.join("accel-probe.json"), &rec);
    (if usable { Accel::Kvm } else { Accel::Tcg }, reason)
}

/// QEMU arguments for an accelerator (`auto` must be resolved first).
pub fn qemu_args(a: Accel) -> Vec<String> {
    match a {
        // The host's CPU model: the guest sees what it runs on.
        Accel::Kvm => vec!["-accel".into(), "kvm".into(), "-cpu".into(), "host".into()],
        _ => vec!["-accel".into(), "tcg".into()],
    }
}

/// For doctor: a human summary without booting.
pub fn describe(paths: &Paths) -> String {
    match (kvm_device(), cached(paths)) {
        (Err(e), _) => format!("tcg (no usable KVM device: {e})"),
        (Ok(()), Some(rec)) if rec.kvm_usable => "kvm (probe boot finished)".into(),
        (Ok(()), Some(rec)) => format!("tcg ({})", rec.reason),
        (Ok(()), None) => {
            "not probed yet: /dev/kvm opens; the first `phyfarm boot` probes it".into()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp_paths() -> (tempfile::TempDir, Paths) {
        let d = tempfile::tempdir().unwrap();
        let p = Paths {
            repo: "/repo".into(),
            cache: d.path().to_path_buf(),
        };
        (d, p)
    }

    #[test]
    fn explicit_choice_is_not_probed() {
        let (_d, p) = tmp_paths();
        let (a, why) = resolve(&p, Accel::Tcg, &|_| panic!("must not probe"));
        assert_eq!((a, why.as_str()), (Accel::Tcg, "requested"));
    }

    #[test]
    fn missing_device_means_tcg_without_probe() {
        let (_d, p) = tmp_paths();
        let (a, why) = resolve_with(&p, Accel::Auto, Err("/dev/kvm: gone".into()), &|_| {
            panic!("must not probe")
        });
        assert_eq!(a, Accel::Tcg);
        assert!(why.contains("/dev/kvm: gone"), "{why}");
    }

    #[test]
    fn failed_probe_falls_back_to_tcg_and_is_remembered() {
        let (_d, p) = tmp_paths();
        let (a, why) = resolve_with(&p, Accel::Auto, Ok(()), &|_| Ok(false));
        assert_eq!(a, Accel::Tcg);
        assert!(why.contains("did not finish"), "{why}");
        // Second call uses the record, not the probe.
        let (a, why) = resolve_with(&p, Accel::Auto, Ok(()), &|_| panic!("must not probe again"));
        assert_eq!(a, Accel::Tcg);
        assert!(why.contains("probed earlier"), "{why}");
    }

    #[test]
    fn successful_probe_picks_kvm() {
        let (_d, p) = tmp_paths();
        assert_eq!(
            resolve_with(&p, Accel::Auto, Ok(()), &|_| Ok(true)).0,
            Accel::Kvm
        );
        assert_eq!(qemu_args(Accel::Kvm), ["-accel", "kvm", "-cpu", "host"]);
    }
}
