//! Plain greppable log lines on stderr: `I:`, `W:`, `E:`.

use std::sync::atomic::{AtomicU8, Ordering};

static LEVEL: AtomicU8 = AtomicU8::new(1);

/// 0: errors and warnings only; 1: normal; 2: every usbredir message.
pub fn set_level(level: u8) {
    LEVEL.store(level, Ordering::Relaxed);
}

pub fn level() -> u8 {
    LEVEL.load(Ordering::Relaxed)
}

#[doc(hidden)]
pub fn emit(tag: char, args: std::fmt::Arguments<'_>) {
    eprintln!("{tag}: {args}");
}

/// Informational line (`I:`).
#[macro_export]
macro_rules! log_i {
    ($($a:tt)*) => { if $crate::log::level() >= 1 { $crate::log::emit('I', format_args!($($a)*)) } };
}

/// Trace line, only at `-vv` (`I:` prefix as well).
#[macro_export]
macro_rules! log_t {
    ($($a:tt)*) => { if $crate::log::level() >= 2 { $crate::log::emit('I', format_args!($($a)*)) } };
}

/// Warning (`W:`): odd guest input, dropped frames, recoverable trouble.
#[macro_export]
macro_rules! log_w {
    ($($a:tt)*) => { $crate::log::emit('W', format_args!($($a)*)) };
}

/// Error (`E:`).
#[macro_export]
macro_rules! log_e {
    ($($a:tt)*) => { $crate::log::emit('E', format_args!($($a)*)) };
}
