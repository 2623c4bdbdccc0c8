//! Ingest: a revision of a patch series read from a directory or an mbox,
//! and the revisions a change to `patches/` adds, modifies or removes.
//! Everything here is untrusted input; bad input is refused with exit 2.

pub mod series;
pub mod series_changed;
