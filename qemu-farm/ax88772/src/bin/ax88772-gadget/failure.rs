//! The gadget's threads, and how one of them failing ends the gadget: its
//! error (or panic) is reported to the main thread, the only one that
//! takes back what the gadget made, so that happens once however many
//! threads fail together. A worker's failure (the model's reader, a pump,
//! the relay) exits 1; one of the main path's, ep0's included, exits 2.

use std::any::Any;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc::{channel, Receiver, Sender};

use anyhow::{anyhow, Result};

/// A worker thread's failure, shown as the worker's own error.
#[derive(Debug)]
pub(crate) struct WorkerFailed(pub(crate) anyhow::Error);

impl std::fmt::Display for WorkerFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:#}", self.0)
    }
}

impl std::error::Error for WorkerFailed {}

/// The exit status for the error that ended the gadget.
pub(crate) fn exit_code(e: &anyhow::Error) -> u8 {
    if e.is::<WorkerFailed>() {
        1
    } else {
        2
    }
}

/// Where the gadget's threads report the failure that ends it; the main
/// thread waits on the other end for the first.
#[derive(Clone)]
pub(crate) struct Failures(Sender<anyhow::Error>);

/// A place to report failures, and the end the main thread waits on.
pub(crate) fn failures() -> (Failures, Receiver<anyhow::Error>) {
    let (tx, rx) = channel();
    (Failures(tx), rx)
}

impl Failures {
    /// Run `work` on a thread named `name`: its error or panic ends the
    /// gadget as a worker's failure (exit 1).
    pub(crate) fn worker(&self, name: &str, work: impl FnOnce() -> Result<()> + Send + 'static) {
        self.spawn(name, true, work);
    }

    /// Run `work`, a part of the main path, on a thread named `name`: its
    /// error or panic ends the gadget as the main path's would (exit 2).
    pub(crate) fn main_path(&self, name: &str, work: impl FnOnce() -> Result<()> + Send + 'static) {
        self.spawn(name, false, work);
    }

    fn spawn(&self, name: &str, worker: bool, work: impl FnOnce() -> Result<()> + Send + 'static) {
        let (tx, thread) = (self.0.clone(), name.to_string());
        std::thread::Builder::new()
            .name(thread.clone())
            .spawn(move || {
                let e = match catch_unwind(AssertUnwindSafe(work)) {
                    Ok(Ok(())) => return,
                    Ok(Err(e)) => e,
                    Err(p) => anyhow!("the {thread} thread panicked: {}", panic_text(&*p)),
                };
                // The first report ends the gadget; a later one finds it
                // ending (or gone) and is dropped.
                let _ = tx.send(if worker { WorkerFailed(e).into() } else { e });
            })
            .expect("starting a thread");
    }
}

/// What a panic said, when it said it in text.
fn panic_text(p: &(dyn Any + Send)) -> &str {
    p.downcast_ref::<&str>()
        .copied()
        .or_else(|| p.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(no message)")
}
