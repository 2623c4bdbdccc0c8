//! Where things live: the repository (Containerfiles, config fragments) and the
//! cache directory outside it (kernel source, build trees, guest images).

use std::fmt;
use std::path::{Path, PathBuf};

use thiserror::Error;

#[derive(Debug, Error)]
pub enum ConfigError {
    #[error("cannot find the phyfarm repository (containers/kbuild.Containerfile); run from inside it or set PHYFARM_REPO")]
    RepoNotFound,
    #[error("no cache directory: set PHYFARM_CACHE, XDG_CACHE_HOME or HOME")]
    NoCache,
    #[error("cache directory {0} cannot be used in a container mount (it contains ',' or ':'): set PHYFARM_CACHE to a plain path")]
    BadCachePath(PathBuf),
}

/// The two kernel builds phyfarm compares.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, clap::ValueEnum, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Variant {
    /// The Rust AX88772A PHY driver (CONFIG_AX88796B_RUST_PHY=y).
    Rust,
    /// The C AX88772A PHY driver (CONFIG_AX88796B_RUST_PHY=n).
    C,
}

impl Variant {
    pub const ALL: [Variant; 2] = [Variant::Rust, Variant::C];

    pub fn name(self) -> &'static str {
        match self {
            Variant::Rust => "rust",
            Variant::C => "c",
        }
    }

    pub fn other(self) -> Variant {
        match self {
            Variant::Rust => Variant::C,
            Variant::C => Variant::Rust,
        }
    }
}

impl fmt::Display for Variant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Resolved locations for one invocation.
#[derive(Debug, Clone)]
pub struct Paths {
    /// The phyfarm repository (read-only inputs).
    pub repo: PathBuf,
    /// The cache directory (everything kernel-sized).
    pub cache: PathBuf,
}

impl Paths {
    /// Flags first, then `PHYFARM_CACHE`, then `$XDG_CACHE_HOME/phyfarm`, then
    /// `~/.cache/phyfarm`.
    pub fn resolve(cache_flag: Option<PathBuf>) -> Result<Paths, ConfigError> {
        let cache = match cache_flag {
            Some(p) => p,
            None => default_cache()?,
        };
        let cache = absolute(&cache);
        let s = cache.to_string_lossy();
        if s.contains(',') || s.contains(':') {
            return Err(ConfigError::BadCachePath(cache));
        }
        Ok(Paths {
            repo: find_repo()?,
            cache,
        })
    }

    pub fn containers_dir(&self) -> PathBuf {
        self.repo.join("containers")
    }
    pub fn kconfig_dir(&self) -> PathBuf {
        self.repo.join("pipeline/kconfig")
    }
    pub fn images_dir(&self) -> PathBuf {
        self.cache.join("images")
    }
    pub fn src_root(&self) -> PathBuf {
        self.cache.join("src")
    }
    pub fn build_root(&self) -> PathBuf {
        self.cache.join("build")
    }
    pub fn guest_dir(&self) -> PathBuf {
        self.cache.join("guest")
    }
    pub fn runs_dir(&self) -> PathBuf {
        self.cache.join("runs")
    }
    pub fn out_default(&self, variant: Variant) -> PathBuf {
        self.cache.join("out").join(variant.name())
    }
}

pub fn default_cache() -> Result<PathBuf, ConfigError> {
    if let Some(p) = std::env::var_os("PHYFARM_CACHE").filter(|p| !p.is_empty()) {
        return Ok(PathBuf::from(p));
    }
    if let Some(p) = std::env::var_os("XDG_CACHE_HOME").filter(|p| !p.is_empty()) {
        return Ok(PathBuf::from(p).join("phyfarm"));
    }
    match std::env::var_os("HOME").filter(|p| !p.is_empty()) {
        Some(h) => Ok(PathBuf::from(h).join(".cache/phyfarm")),
        None => Err(ConfigError::NoCache),
    }
}

/// Make a path absolute against the current directory, without touching the
/// file system otherwise.
pub fn absolute(p: &Path) -> PathBuf {
    if p.is_absolute() {
        p.to_path_buf()
    } else {
        std::env::current_dir()
            .map(|d| d.join(p))
            .unwrap_or_else(|_| p.to_path_buf())
    }
}

fn is_repo(dir: &Path) -> bool {
    dir.join("containers/kbuild.Containerfile").is_file() && dir.join("pipeline/kconfig").is_dir()
}

fn find_repo() -> Result<PathBuf, ConfigError> {
    if let Some(p) = std::env::var_os("PHYFARM_REPO").filter(|p| !p.is_empty()) {
        let p = absolute(Path::new(&p));
        return if is_repo(&p) {
            Ok(p)
        } else {
            Err(ConfigError::RepoNotFound)
        };
    }
    let mut starts = Vec::new();
    if let Ok(d) = std::env::current_dir() {
        starts.push(d);
    }
    if let Ok(exe) = std::env::current_exe() {
        starts.push(exe);
    }
    // The source checkout this binary was built from, as a last resort.
    starts.push(PathBuf::from(env!("CARGO_MANIFEST_DIR")));
    for start in starts {
        for dir in start.ancestors() {
            if is_repo(dir) {
                return Ok(dir.to_path_buf());
            }
        }
    }
    Err(ConfigError::RepoNotFound)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn variant_names_round_trip() {
        for v in Variant::ALL {
            let parsed = <Variant as clap::ValueEnum>::from_str(v.name(), false).unwrap();
            assert_eq!(parsed, v);
            assert_ne!(v.other(), v);
        }
    }

    #[test]
    fn cache_flag_with_colon_is_refused() {
        let err = Paths::resolve(Some(PathBuf::from("/tmp/a:b"))).unwrap_err();
        assert!(err.to_string().contains("/tmp/a:b"), "{err}");
    }

    #[test]
    fn repo_is_found_from_the_crate() {
        let p = Paths::resolve(Some(PathBuf::from("/tmp/phyfarm-test-cache"))).unwrap();
        assert!(p.kconfig_dir().join("phyfarm.config").is_file());
    }
}
