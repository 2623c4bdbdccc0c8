//! Build: the distro kernel source in the kbuild container, its base builds,
//! the series applied and built patch by patch in both variants, the new
//! warnings, and the Rust gates (run only on what the series can affect).

pub mod apply;
pub mod gate_scope;
pub mod images;
pub mod kconfig;
pub mod kernel;
pub mod metadata;
pub mod series_build;
pub mod steps;
pub mod warnings;
