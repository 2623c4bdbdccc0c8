//! Plain, greppable progress on stderr (`I:`/`W:`/`E:`), and a runner that
//! streams a long command's output into a log while printing a heartbeat.

use std::fs::File;
use std::io::{self, BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

pub fn info(msg: &str) {
    eprintln!("I: {msg}");
}

pub fn warn(msg: &str) {
    eprintln!("W: {msg}");
}

/// Replace control characters (escape sequences from untrusted subjects,
/// hunks and build output) before anything reaches a terminal.
pub fn printable(s: &str) -> String {
    s.chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .collect()
}

/// What a logged command left behind.
#[derive(Debug)]
pub struct Finished {
    pub status: ExitStatus,
    pub elapsed: Duration,
    /// Why phyfarm stopped the command (a limit it enforces), if it did.
    pub stopped: Option<String>,
}

/// A watch over a running command: asked four times a second; an answer
/// stops the command (`stop` is called, then the child is killed).
pub trait Watch {
    fn check(&mut self, elapsed: Duration) -> Option<String>;
    fn stop(&mut self) {}
}

/// No watch at all.
pub struct Unwatched;

impl Watch for Unwatched {
    fn check(&mut self, _: Duration) -> Option<String> {
        None
    }
}

/// Build a `Command` from an argv and an optional working directory.
pub fn command(argv: &[String], cwd: Option<&Path>, env: &[(String, String)]) -> Command {
    let mut cmd = Command::new(&argv[0]);
    cmd.args(&argv[1..]);
    if let Some(d) = cwd {
        cmd.current_dir(d);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd
}

/// Run `cmd`, appending stdout and stderr (line-interleaved) to `log`. Every
/// `heartbeat` a line `I: <label>: <elapsed>s, last: <last output line>` goes to
/// stderr, so a long build shows it is alive.
pub fn run_logged(
    cmd: Command,
    log: &mut File,
    label: &str,
    heartbeat: Duration,
) -> io::Result<Finished> {
    run_watched(cmd, log, label, heartbeat, &mut Unwatched)
}

/// [`run_logged`] under a [`Watch`]: when it answers, the command is
/// stopped, the reason is logged and returned in [`Finished::stopped`].
pub fn run_watched(
    mut cmd: Command,
    log: &mut File,
    label: &str,
    heartbeat: Duration,
    watch: &mut dyn Watch,
) -> io::Result<Finished> {
    let start = Instant::now();
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn()?;
    let (tx, rx) = mpsc::channel::<Vec<u8>>();
    let mut readers = Vec::new();
    let out = child.stdout.take().expect("piped stdout");
    let err = child.stderr.take().expect("piped stderr");
    for stream in [Box::new(out) as Box<dyn io::Read + Send>, Box::new(err)] {
        let tx = tx.clone();
        readers.push(std::thread::spawn(move || {
            let mut r = BufReader::new(stream);
            let mut line = Vec::new();
            while let Ok(n) = r.read_until(b'\n', &mut line) {
                if n == 0 || tx.send(std::mem::take(&mut line)).is_err() {
                    break;
                }
            }
        }));
    }
    drop(tx);
    let mut last = String::new();
    let mut next_beat = start + heartbeat;
    let mut stopped: Option<String> = None;
    let mut stopped_at: Option<Instant> = None;
    let tick = Duration::from_millis(250);
    loop {
        if stopped.is_none() {
            if let Some(why) = watch.check(start.elapsed()) {
                let _ = writeln!(log, "error: phyfarm stopped this step: {why}");
                watch.stop();
                let _ = child.kill();
                stopped = Some(why);
                stopped_at = Some(Instant::now());
            }
        } else if stopped_at.is_some_and(|t| t.elapsed() > Duration::from_secs(10)) {
            // A grandchild may still hold the pipe: stop reading.
            break;
        }
        let wait = next_beat
            .saturating_duration_since(Instant::now())
            .min(tick);
        match rx.recv_timeout(wait) {
            Ok(line) => {
                log.write_all(&line)?;
                if !line.ends_with(b"\n") {
                    log.write_all(b"\n")?;
                }
                let text = String::from_utf8_lossy(&line);
                let text = text.trim();
                if !text.is_empty() {
                    last = printable(&text.chars().take(120).collect::<String>());
                }
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
        if Instant::now() >= next_beat {
            info(&format!(
                "{label}: {}s, last: {last}",
                start.elapsed().as_secs()
            ));
            next_beat = Instant::now() + heartbeat;
        }
    }
    if stopped.is_none() {
        for r in readers {
            let _ = r.join();
        }
    }
    let status = child.wait()?;
    log.flush()?;
    Ok(Finished {
        status,
        elapsed: start.elapsed(),
        stopped,
    })
}

/// Run a short command and return its stdout, or an error carrying stderr.
pub fn capture(argv: &[String], env: &[(String, String)]) -> io::Result<String> {
    let out = command(argv, None, env)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", argv[0])))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let first = err
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("");
        return Err(io::Error::other(format!(
            "`{}` failed ({}): {}",
            argv.join(" "),
            out.status,
            first.trim()
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logged_run_keeps_both_streams() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log");
        let mut f = File::create(&path).unwrap();
        let cmd = command(
            &[
                "sh".into(),
                "-c".into(),
                "echo out; echo err >&2; exit 3".into(),
            ],
            None,
            &[],
        );
        let done = run_logged(cmd, &mut f, "t", Duration::from_secs(60)).unwrap();
        assert_eq!(done.status.code(), Some(3));
        let log = std::fs::read_to_string(&path).unwrap();
        assert!(log.contains("out\n") && log.contains("err\n"), "{log}");
    }

    struct After(u64, bool);

    impl Watch for After {
        fn check(&mut self, elapsed: Duration) -> Option<String> {
            (elapsed.as_secs() >= self.0).then(|| "timed out after 1s (TEST_TIMEOUT)".to_string())
        }
        fn stop(&mut self) {
            self.1 = true;
        }
    }

    #[test]
    fn a_watch_stops_a_command_and_says_why() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log");
        let mut f = File::create(&path).unwrap();
        let cmd = command(&["sleep".into(), "600".into()], None, &[]);
        let mut w = After(1, false);
        let t = Instant::now();
        let done = run_watched(cmd, &mut f, "t", Duration::from_secs(60), &mut w).unwrap();
        assert!(t.elapsed() < Duration::from_secs(30));
        assert!(!done.status.success());
        assert!(w.1, "stop() was not called");
        assert_eq!(
            done.stopped.as_deref(),
            Some("timed out after 1s (TEST_TIMEOUT)")
        );
        let log = std::fs::read_to_string(&path).unwrap();
        assert!(
            log.contains("phyfarm stopped this step: timed out"),
            "{log}"
        );
    }

    #[test]
    fn escape_sequences_never_reach_the_terminal() {
        assert_eq!(printable("a\x1b]0;pwned\x07b\r"), "a?]0;pwned?b?");
    }

    #[test]
    fn capture_reports_stderr_on_failure() {
        let err = capture(
            &["sh".into(), "-c".into(), "echo boom >&2; false".into()],
            &[],
        )
        .unwrap_err();
        assert!(err.to_string().contains("boom"), "{err}");
    }
}
