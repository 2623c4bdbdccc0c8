//! Plain greppable log lines on stderr: `I:`, `W:`, `E:`.
//!
//! Logging cannot hurt the device: lines go through a bounded queue to a
//! writer thread, so a stderr nobody drains never blocks the event loop;
//! a closed stderr (EPIPE) is ignored; and a token bucket limits the rate,
//! with a `W: N log lines suppressed` line once lines flow again.

use std::io::Write;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

static LEVEL: AtomicU8 = AtomicU8::new(1);
/// Lines handed to the writer thread and not yet written.
static QUEUED: AtomicUsize = AtomicUsize::new(0);

/// Lines per second the log sustains, and the burst it allows.
pub const RATE: f64 = 200.0;
pub const BURST: f64 = 1000.0;
/// Lines waiting for the writer thread.
const QUEUE: usize = 4096;
/// Bytes of a hex dump shown in a log line.
pub const HEX_MAX: usize = 32;

/// 0: errors and warnings only; 1: normal; 2: every usbredir message.
pub fn set_level(level: u8) {
    LEVEL.store(level, Ordering::Relaxed);
}

pub fn level() -> u8 {
    LEVEL.load(Ordering::Relaxed)
}

/// Token bucket over lines, with a count of what it held back.
#[derive(Debug)]
pub struct Limiter {
    tokens: f64,
    last: Instant,
    rate: f64,
    burst: f64,
    suppressed: u64,
}

impl Limiter {
    pub fn new(now: Instant, rate: f64, burst: f64) -> Limiter {
        Limiter {
            tokens: burst,
            last: now,
            rate,
            burst,
            suppressed: 0,
        }
    }

    /// Whether a line may go out now. When it may and lines were held back
    /// before it, returns their count too (to be reported first).
    pub fn admit(&mut self, now: Instant) -> (bool, u64) {
        let dt = now.saturating_duration_since(self.last).as_secs_f64();
        self.last = self.last.max(now);
        self.tokens = (self.tokens + dt * self.rate).min(self.burst);
        if self.tokens < 1.0 {
            self.suppressed += 1;
            return (false, 0);
        }
        self.tokens -= 1.0;
        (true, std::mem::take(&mut self.suppressed))
    }

    /// Count a line lost elsewhere (the writer's queue was full).
    pub fn lost(&mut self) {
        self.suppressed += 1;
    }
}

struct Sink {
    limiter: Mutex<Limiter>,
    tx: Option<SyncSender<String>>,
}

static SINK: OnceLock<Sink> = OnceLock::new();

fn writer(rx: Receiver<String>) {
    let mut err = std::io::stderr();
    while let Ok(line) = rx.recv() {
        // A closed or broken stderr loses the line, nothing more.
        let _ = err.write_all(line.as_bytes());
        QUEUED.fetch_sub(1, Ordering::SeqCst);
    }
}

fn sink() -> &'static Sink {
    SINK.get_or_init(|| {
        let (tx, rx) = sync_channel::<String>(QUEUE);
        let tx = std::thread::Builder::new()
            .name("log".into())
            .spawn(move || writer(rx))
            .ok()
            .map(|_| tx);
        Sink {
            limiter: Mutex::new(Limiter::new(Instant::now(), RATE, BURST)),
            tx,
        }
    })
}

fn push(s: &Sink, line: String) -> bool {
    match &s.tx {
        Some(tx) => {
            QUEUED.fetch_add(1, Ordering::SeqCst);
            let sent = tx.try_send(line);
            match sent {
                Ok(()) => true,
                Err(TrySendError::Full(_)) => {
                    QUEUED.fetch_sub(1, Ordering::SeqCst);
                    false
                }
                Err(TrySendError::Disconnected(line)) => {
                    QUEUED.fetch_sub(1, Ordering::SeqCst);
                    let _ = std::io::stderr().write_all(line.as_bytes());
                    true
                }
            }
        }
        None => {
            let _ = std::io::stderr().write_all(line.as_bytes());
            true
        }
    }
}

#[doc(hidden)]
pub fn emit(tag: char, args: std::fmt::Arguments<'_>) {
    let s = sink();
    let Ok(mut lim) = s.limiter.lock() else {
        return;
    };
    admit_line(&mut lim, Instant::now(), tag, args, |line| push(s, line));
}

/// Put out one line if the limiter admits it, preceded by the count of
/// lines held back before it; `push` queues a line and says whether it
/// was taken (a line it refuses counts as suppressed).
fn admit_line(
    lim: &mut Limiter,
    now: Instant,
    tag: char,
    args: std::fmt::Arguments<'_>,
    mut push: impl FnMut(String) -> bool,
) {
    let (ok, held) = lim.admit(now);
    if !ok {
        return;
    }
    if held > 0 && !push(format!("W: {held} log lines suppressed\n")) {
        lim.suppressed += held;
    }
    if !push(format!("{tag}: {args}\n")) {
        lim.lost();
    }
}

/// Wait (at most `limit`) until the writer thread has written every line.
pub fn flush(limit: Duration) {
    wait_drained(&QUEUED, limit, || {
        std::thread::sleep(Duration::from_millis(2))
    });
}

/// Call `nap` until `queued` is zero or `limit` has passed.
fn wait_drained(queued: &AtomicUsize, limit: Duration, mut nap: impl FnMut()) {
    let end = Instant::now() + limit;
    while queued.load(Ordering::SeqCst) > 0 && Instant::now() < end {
        nap();
    }
}

/// At most [`HEX_MAX`] bytes as hex, with the rest counted.
pub fn hex(data: &[u8]) -> String {
    let mut s: String = data
        .iter()
        .take(HEX_MAX)
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(" ");
    if data.len() > HEX_MAX {
        s.push_str(&format!(" ... ({} bytes)", data.len()));
    }
    s
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limiter_holds_back_a_flood_and_counts_it() {
        let t = Instant::now();
        let mut l = Limiter::new(t, 10.0, 5.0);
        let admitted = (0..100).filter(|_| l.admit(t).0).count();
        assert_eq!(admitted, 5, "the burst, then nothing");
        // Half a second later: five tokens, and the 95 held back are reported.
        let (ok, held) = l.admit(t + Duration::from_millis(500));
        assert!(ok);
        assert_eq!(held, 95);
        let (ok, held) = l.admit(t + Duration::from_millis(500));
        assert!(ok);
        assert_eq!(held, 0, "reported once");
        l.lost();
        let (_, held) = l.admit(t + Duration::from_secs(10));
        assert_eq!(held, 1, "lines lost in the queue count too");
    }

    #[test]
    fn the_bucket_does_not_grow_past_its_burst() {
        let t = Instant::now();
        let mut l = Limiter::new(t, 10.0, 3.0);
        let later = t + Duration::from_secs(3600);
        assert_eq!((0..10).filter(|_| l.admit(later).0).count(), 3);
    }

    #[test]
    fn held_back_lines_are_reported_before_the_next_line() {
        let t = Instant::now();
        let mut l = Limiter::new(t, 10.0, 1.0);
        let mut out = Vec::new();
        let mut take = |line: String| {
            out.push(line);
            true
        };
        admit_line(&mut l, t, 'I', format_args!("first"), &mut take);
        admit_line(&mut l, t, 'I', format_args!("held"), &mut take);
        admit_line(&mut l, t, 'I', format_args!("held"), &mut take);
        admit_line(
            &mut l,
            t + Duration::from_secs(1),
            'E',
            format_args!("x"),
            &mut take,
        );
        assert_eq!(
            out,
            ["I: first\n", "W: 2 log lines suppressed\n", "E: x\n"],
            "the report comes once, before the line that follows the flood"
        );
    }

    #[test]
    fn lines_the_queue_refuses_are_counted_as_suppressed() {
        let t = Instant::now();
        let mut l = Limiter::new(t, 10.0, 5.0);
        admit_line(&mut l, t, 'W', format_args!("lost"), |_| false);
        let mut out = Vec::new();
        admit_line(&mut l, t, 'I', format_args!("kept"), |line| {
            out.push(line);
            true
        });
        assert_eq!(out, ["W: 1 log lines suppressed\n", "I: kept\n"]);
    }

    #[test]
    fn the_lines_a_refused_report_stood_for_are_reported_again() {
        let t = Instant::now();
        let mut l = Limiter::new(t, 10.0, 5.0);
        admit_line(&mut l, t, 'W', format_args!("lost"), |_| false);
        // The report of that line and the next line are refused too: the
        // next report still counts both lines.
        admit_line(&mut l, t, 'W', format_args!("lost too"), |_| false);
        let mut out = Vec::new();
        admit_line(&mut l, t, 'I', format_args!("kept"), |line| {
            out.push(line);
            true
        });
        assert_eq!(out, ["W: 2 log lines suppressed\n", "I: kept\n"]);
    }

    #[test]
    fn flush_returns_at_once_when_nothing_is_queued() {
        let queued = AtomicUsize::new(0);
        wait_drained(&queued, Duration::from_secs(3600), || {
            panic!("waited with an empty queue")
        });
        // Lines queued: it waits until the writer has taken them.
        let queued = AtomicUsize::new(3);
        let mut naps = 0;
        wait_drained(&queued, Duration::from_secs(3600), || {
            naps += 1;
            queued.fetch_sub(1, Ordering::SeqCst);
        });
        assert_eq!(naps, 3);
        assert_eq!(queued.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn the_level_set_is_the_level_read() {
        // Only this test changes the level: the others log at the default.
        let was = level();
        set_level(2);
        assert_eq!(level(), 2);
        set_level(was);
        assert_eq!(level(), was);
    }

    #[test]
    fn hex_dumps_are_capped() {
        assert_eq!(hex(&[1, 0xab]), "01 ab");
        let h = hex(&[0u8; 4096]);
        assert!(h.ends_with(" ... (4096 bytes)"), "{h}");
        assert_eq!(h.matches("00").count(), HEX_MAX);
        // Exactly the cap: all of it, and nothing counted.
        let h = hex(&[0u8; HEX_MAX]);
        assert_eq!(h.matches("00").count(), HEX_MAX);
        assert!(!h.contains("..."), "{h}");
    }
}
