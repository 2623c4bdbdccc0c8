//! The run folder: where each stage of `phyfarm run` writes, spelled once.
//!
//! ```text
//! <run>/series-build.json          the series build (series_build::SeriesBuild)
//! <run>/patches/                   the staged patches
//! <run>/logs/                      per-patch build, gate and KUnit build logs
//! <run>/<variant>/bzImage          the patched kernels (rust, c), with metadata.json
//! <run>/<variant>/boot/            their boot checks
//! <run>/rust-kunit/bzImage         the KUnit build of the patched tree
//! <run>/farm/, farm-throughput/    the farm's results.json (contract::FarmResults),
//!                                  each with its -retry/ twin
//! <run>/confirm/                   the interleaved throughput re-measurement
//! <run>/base/                      the same layout for the unpatched base
//! <run>/results.json, results-base.json   the recorded runs (results::Run)
//! ```
//!
//! The farm harness finds kernels in the same layout: `<artifacts>/<variant>/bzImage`
//! and `<artifacts>/rust-kunit/bzImage` (harness/phyfarm_farm, pytest-tests/farm/test_kunit.py).

use std::path::{Path, PathBuf};

/// The folder of the KUnit kernel (beside `rust/` and `c/`).
pub const KUNIT_DIR: &str = "rust-kunit";

/// One run's folder, or its `base/` part.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunFolder {
    root: PathBuf,
}

impl RunFolder {
    pub fn new(root: impl Into<PathBuf>) -> RunFolder {
        RunFolder { root: root.into() }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The unpatched base's part of the run, laid out the same way.
    pub fn base(&self) -> RunFolder {
        RunFolder::new(self.root.join("base"))
    }

    pub fn series_build(&self) -> PathBuf {
        self.root.join("series-build.json")
    }

    pub fn patches(&self) -> PathBuf {
        self.root.join("patches")
    }

    pub fn logs(&self) -> PathBuf {
        self.root.join("logs")
    }

    /// A variant's folder (`rust`, `c`, or [`KUNIT_DIR`]).
    pub fn variant(&self, v: &str) -> PathBuf {
        self.root.join(v)
    }

    pub fn kernel(&self, v: &str) -> PathBuf {
        self.variant(v).join("bzImage")
    }

    pub fn metadata(&self, v: &str) -> PathBuf {
        self.variant(v).join("metadata.json")
    }

    pub fn boot(&self, v: &str) -> PathBuf {
        self.variant(v).join("boot")
    }

    pub fn kunit(&self) -> PathBuf {
        self.variant(KUNIT_DIR)
    }

    /// The farm's checks (all but throughput).
    pub fn farm(&self) -> PathBuf {
        self.root.join("farm")
    }

    /// Throughput, measured apart.
    pub fn farm_throughput(&self) -> PathBuf {
        self.root.join("farm-throughput")
    }

    pub fn confirm(&self) -> PathBuf {
        self.root.join("confirm")
    }

    pub fn results(&self) -> PathBuf {
        self.root.join("results.json")
    }

    pub fn results_base(&self) -> PathBuf {
        self.root.join("results-base.json")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_base_is_laid_out_like_the_revision() {
        let r = RunFolder::new("/runs/s-v8");
        assert_eq!(r.kernel("rust"), Path::new("/runs/s-v8/rust/bzImage"));
        assert_eq!(r.base().kernel("c"), Path::new("/runs/s-v8/base/c/bzImage"));
        assert_eq!(r.base().kunit().join("bzImage"), r.base().kernel(KUNIT_DIR));
        assert_eq!(r.base().farm(), Path::new("/runs/s-v8/base/farm"));
        assert_eq!(r.farm_throughput(), Path::new("/runs/s-v8/farm-throughput"));
        assert_eq!(r.results_base(), Path::new("/runs/s-v8/results-base.json"));
    }

    #[test]
    fn the_harness_reads_kernels_where_the_run_writes_them() {
        let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let kunit = std::fs::read_to_string(repo.join("pytest-tests/farm/test_kunit.py")).unwrap();
        assert!(kunit.contains(&format!("\"{KUNIT_DIR}\" / \"bzImage\"")));
        // The farm's kernels are found by phyfarm (the guest plan) where the
        // run writes them.
        let d = tempfile::tempdir().unwrap();
        let r = RunFolder::new(d.path());
        for v in ["rust", "c"] {
            std::fs::create_dir_all(r.kernel(v).parent().unwrap()).unwrap();
            std::fs::write(r.kernel(v), b"bzImage").unwrap();
        }
        let mut opts = crate::farm::TestOptions::new(crate::sandbox::runtime::Runtime::Host);
        opts.artifacts = Some(r.root().to_path_buf());
        let found = crate::farm::kernels(&opts).unwrap();
        assert_eq!(
            found,
            vec![
                ("rust".to_string(), r.kernel("rust")),
                ("c".to_string(), r.kernel("c"))
            ]
        );
    }
}
