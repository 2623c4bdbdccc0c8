//! phyfarm's guest agent: one JSON object per line in, one per line out.
//!
//! Requests (each line is independent and runs on its own thread, so a long
//! command never blocks a short one; replies carry the request's `id`):
//!
//! ```text
//! {"id":1,"argv":["ip","-j","link"],"timeout":10,"stdin":"..."}
//! {"id":2,"wait":{"all":[{"path":"/sys/class/net/eth0/carrier","equals":"0"}],
//!         "timeout":5,"interval_ms":5,"read":["/sys/class/net/eth0/operstate"]}}
//! ```
//!
//! Replies: `{"id":1,"exit":0,"stdout":"...","stderr":"...","seconds":0.012,
//! "timed_out":false,"truncated":false}`. A command runs from `argv` directly,
//! never through a shell (unless argv says `sh -c`); output is bounded; a
//! command that outlives its timeout is killed with its whole process group.
//! A `wait` polls files until every condition holds and answers with the
//! values it saw (`values`) and the files named in `read`.

use std::collections::BTreeMap;
use std::io::{self, BufRead, Read, Write};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Map, Value};

/// The virtio-serial port name the host opens.
pub const PORT_NAME: &str = "org.phyfarm.agent";
/// Default bound on captured stdout and stderr, each.
pub const DEFAULT_MAX_OUTPUT: usize = 1 << 20;
/// Default command timeout in seconds.
pub const DEFAULT_TIMEOUT: f64 = 60.0;

/// What a request asks for, validated.
#[derive(Debug, Clone, PartialEq)]
pub enum Request {
    Run {
        id: Value,
        argv: Vec<String>,
        timeout: Duration,
        stdin: Option<String>,
        max_output: usize,
    },
    Wait {
        id: Value,
        all: Vec<Condition>,
        timeout: Duration,
        interval: Duration,
        read: Vec<String>,
    },
}

/// One file condition of a `wait`.
#[derive(Debug, Clone, PartialEq)]
pub struct Condition {
    pub path: String,
    pub equals: Option<String>,
    pub not_equals: Option<String>,
}

impl Condition {
    fn holds(&self, value: &str) -> bool {
        self.equals.as_deref().map_or(true, |e| e == value)
            && self.not_equals.as_deref() != Some(value)
    }
}

fn seconds(v: Option<&Value>, default: f64) -> Result<Duration, String> {
    let s = match v {
        None | Some(Value::Null) => default,
        Some(v) => v.as_f64().ok_or("timeout must be a number of seconds")?,
    };
    if !(s.is_finite() && s > 0.0 && s <= 86_400.0) {
        return Err(format!("timeout {s} is out of range (0, 86400]"));
    }
    Ok(Duration::from_secs_f64(s))
}

/// Parse one request line. The error carries the id when one was readable.
pub fn parse(line: &str) -> Result<Request, (Value, String)> {
    let v: Value =
        serde_json::from_str(line).map_err(|e| (Value::Null, format!("bad JSON: {e}")))?;
    let Value::Object(o) = v else {
        return Err((Value::Null, "a request is a JSON object".into()));
    };
    let id = o.get("id").cloned().unwrap_or(Value::Null);
    let fail = |m: String| (id.clone(), m);
    if let Some(argv) = o.get("argv") {
        let argv: Vec<String> = argv
            .as_array()
            .ok_or_else(|| fail("argv must be an array of strings".into()))?
            .iter()
            .map(|a| a.as_str().map(str::to_string))
            .collect::<Option<_>>()
            .ok_or_else(|| fail("argv must be an array of strings".into()))?;
        if argv.is_empty() {
            return Err(fail("argv is empty".into()));
        }
        let timeout = seconds(o.get("timeout"), DEFAULT_TIMEOUT).map_err(fail)?;
        let stdin = match o.get("stdin") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(s.clone()),
            Some(_) => return Err(fail("stdin must be a string".into())),
        };
        let max_output = match o.get("max_output") {
            None => DEFAULT_MAX_OUTPUT,
            Some(v) => v
                .as_u64()
                .filter(|n| *n <= 64 << 20)
                .ok_or_else(|| fail("max_output must be at most 64 MiB".into()))?
                as usize,
        };
        return Ok(Request::Run {
            id,
            argv,
            timeout,
            stdin,
            max_output,
        });
    }
    if let Some(Value::Object(w)) = o.get("wait") {
        let conds = w
            .get("all")
            .and_then(Value::as_array)
            .ok_or_else(|| fail("wait needs \"all\": [{\"path\":...}]".into()))?;
        let mut all = Vec::new();
        for c in conds {
            let path = c
                .get("path")
                .and_then(Value::as_str)
                .ok_or_else(|| fail("every wait condition needs a path".into()))?;
            let s = |k: &str| c.get(k).and_then(Value::as_str).map(str::to_string);
            all.push(Condition {
                path: path.into(),
                equals: s("equals"),
                not_equals: s("not_equals"),
            });
        }
        let interval_ms = w.get("interval_ms").and_then(Value::as_u64).unwrap_or(5);
        let read = w
            .get("read")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(Value::as_str)
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default();
        let timeout = seconds(w.get("timeout"), 10.0).map_err(fail)?;
        return Ok(Request::Wait {
            id,
            all,
            timeout,
            interval: Duration::from_millis(interval_ms.clamp(1, 1000)),
            read,
        });
    }
    Err(fail("a request needs \"argv\" or \"wait\"".into()))
}

/// A file's content, trimmed; "" when it cannot be read (e.g. the carrier
/// file of an interface that is down).
pub fn read_value(path: &str) -> String {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

fn read_bounded(mut r: impl Read, max: usize) -> (Vec<u8>, bool) {
    let mut out = Vec::new();
    let mut truncated = false;
    let mut buf = [0u8; 8192];
    loop {
        match r.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                let room = max.saturating_sub(out.len());
                if n > room {
                    truncated = true;
                }
                out.extend_from_slice(&buf[..n.min(room)]);
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    (out, truncated)
}

extern "C" {
    fn kill(pid: i32, sig: i32) -> i32;
}
const SIGKILL: i32 = 9;

fn kill_group(pgid: u32) {
    // SAFETY: kill(2) with a negative pid signals a process group; it has no
    // memory-safety preconditions.
    unsafe {
        kill(-(pgid as i32), SIGKILL);
    }
}

/// Run one command; always returns a reply object.
pub fn run(
    id: Value,
    argv: &[String],
    timeout: Duration,
    stdin: Option<&str>,
    max: usize,
) -> Value {
    use std::os::unix::process::{CommandExt, ExitStatusExt};
    let start = Instant::now();
    let mut cmd = Command::new(&argv[0]);
    cmd.args(&argv[1..])
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            return json!({"id": id, "exit": 127, "stdout": "", "stderr": format!("cannot run {}: {e}\n", argv[0]),
                "seconds": start.elapsed().as_secs_f64(), "timed_out": false, "truncated": false});
        }
    };
    if let (Some(data), Some(mut w)) = (stdin, child.stdin.take()) {
        let data = data.to_string();
        std::thread::spawn(move || {
            let _ = w.write_all(data.as_bytes());
        });
    }
    let (tx, rx) = mpsc::channel();
    for (which, r) in [
        (
            0u8,
            child
                .stdout
                .take()
                .map(|r| Box::new(r) as Box<dyn Read + Send>),
        ),
        (
            1u8,
            child
                .stderr
                .take()
                .map(|r| Box::new(r) as Box<dyn Read + Send>),
        ),
    ] {
        if let Some(r) = r {
            let tx = tx.clone();
            std::thread::spawn(move || {
                let _ = tx.send((which, read_bounded(r, max)));
            });
        }
    }
    drop(tx);
    let pgid = child.id();
    let mut timed_out = false;
    let mut nap = Duration::from_micros(500);
    let status = loop {
        match child.try_wait() {
            Ok(Some(st)) => break Some(st),
            Ok(None) => {}
            Err(_) => break None,
        }
        if start.elapsed() >= timeout {
            timed_out = true;
            kill_group(pgid);
            break child.wait().ok();
        }
        std::thread::sleep(nap);
        nap = (nap * 2).min(Duration::from_millis(10));
    };
    let seconds = start.elapsed().as_secs_f64();
    // Output of a detached grandchild may keep the pipes open: wait a little,
    // then answer with what arrived.
    let mut outs: [(Vec<u8>, bool); 2] = Default::default();
    let deadline = Instant::now() + Duration::from_millis(if timed_out { 200 } else { 1000 });
    for _ in 0..2 {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok((which, o)) => outs[which as usize] = o,
            Err(_) => break,
        }
    }
    let exit = match status {
        Some(st) => st.code().unwrap_or_else(|| 128 + st.signal().unwrap_or(0)),
        None => -1,
    };
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    json!({
        "id": id,
        "exit": exit,
        "stdout": text(&outs[0].0),
        "stderr": text(&outs[1].0),
        "seconds": seconds,
        "timed_out": timed_out,
        "truncated": outs[0].1 || outs[1].1,
    })
}

/// Poll files until every condition holds or the timeout passes.
pub fn wait(
    id: Value,
    all: &[Condition],
    timeout: Duration,
    interval: Duration,
    read: &[String],
) -> Value {
    let start = Instant::now();
    let mut polls = 0u64;
    loop {
        polls += 1;
        let values: BTreeMap<String, String> = all
            .iter()
            .map(|c| (c.path.clone(), read_value(&c.path)))
            .collect();
        let ok = all.iter().all(|c| c.holds(&values[&c.path]));
        if ok || start.elapsed() >= timeout {
            let extra: Map<String, Value> = read
                .iter()
                .map(|p| (p.clone(), Value::String(read_value(p))))
                .collect();
            return json!({
                "id": id,
                "exit": if ok { 0 } else { 1 },
                "stdout": "",
                "stderr": if ok { String::new() } else { format!("conditions not met within {:.3}s", timeout.as_secs_f64()) },
                "seconds": start.elapsed().as_secs_f64(),
                "timed_out": !ok,
                "truncated": false,
                "values": values,
                "read": extra,
                "polls": polls,
            });
        }
        std::thread::sleep(interval);
    }
}

/// Answer one request line.
pub fn handle(line: &str) -> Value {
    match parse(line) {
        Ok(Request::Run {
            id,
            argv,
            timeout,
            stdin,
            max_output,
        }) => run(id, &argv, timeout, stdin.as_deref(), max_output),
        Ok(Request::Wait {
            id,
            all,
            timeout,
            interval,
            read,
        }) => wait(id, &all, timeout, interval, &read),
        Err((id, e)) => json!({"id": id, "exit": -1, "error": e, "stdout": "", "stderr": e,
            "seconds": 0.0, "timed_out": false, "truncated": false}),
    }
}

/// The first line the agent sends: it is up, and how long the guest took.
pub fn hello() -> Value {
    let uptime = read_value("/proc/uptime")
        .split_whitespace()
        .next()
        .and_then(|s| s.parse::<f64>().ok());
    json!({"ready": true, "agent": concat!("phyfarm-agent ", env!("CARGO_PKG_VERSION")),
        "uptime": uptime, "kernel": read_value("/proc/sys/kernel/osrelease")})
}

/// Serve requests from `input` until it ends; replies go to `output` one
/// line each, in completion order. Returns how many requests were answered.
pub fn serve<R: BufRead, W: Write + Send + 'static>(input: R, output: W) -> io::Result<u64> {
    let out = Arc::new(Mutex::new(output));
    let send = |out: &Arc<Mutex<W>>, v: &Value| -> io::Result<()> {
        let mut line = serde_json::to_vec(v).map_err(io::Error::other)?;
        line.push(b'\n');
        let mut w = out.lock().unwrap_or_else(|e| e.into_inner());
        w.write_all(&line)?;
        w.flush()
    };
    send(&out, &hello())?;
    let mut workers = Vec::new();
    let mut n = 0;
    for line in input.split(b'\n') {
        let line = line?;
        let line = String::from_utf8_lossy(&line).trim().to_string();
        if line.is_empty() {
            continue;
        }
        n += 1;
        let out = Arc::clone(&out);
        workers.push(std::thread::spawn(move || {
            let reply = handle(&line);
            let _ = send(&out, &reply);
        }));
        workers.retain(|w| !w.is_finished());
    }
    for w in workers {
        let _ = w.join();
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Cursor;

    fn argv(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn parses_a_run_request_with_defaults() {
        let r = parse(r#"{"id":7,"argv":["ip","link"]}"#).unwrap();
        assert_eq!(
            r,
            Request::Run {
                id: json!(7),
                argv: argv(&["ip", "link"]),
                timeout: Duration::from_secs(60),
                stdin: None,
                max_output: DEFAULT_MAX_OUTPUT,
            }
        );
    }

    #[test]
    fn rejects_bad_requests_with_the_id() {
        for (line, want) in [
            (r#"{"id":3,"argv":[]}"#, "argv is empty"),
            (r#"{"id":3,"argv":"ls"}"#, "array of strings"),
            (r#"{"id":3,"argv":["ls",1]}"#, "array of strings"),
            (r#"{"id":3,"argv":["ls"],"timeout":-1}"#, "out of range"),
            (r#"{"id":3}"#, "needs \"argv\" or \"wait\""),
            (
                r#"{"id":3,"wait":{"all":[{"equals":"1"}]}}"#,
                "needs a path",
            ),
        ] {
            let (id, e) = parse(line).unwrap_err();
            assert_eq!(id, json!(3), "{line}");
            assert!(e.contains(want), "{line}: {e}");
        }
        let (id, e) = parse("not json").unwrap_err();
        assert_eq!(id, Value::Null);
        assert!(e.starts_with("bad JSON"), "{e}");
    }

    #[test]
    fn runs_without_a_shell_and_reports_exit_and_output() {
        let r = run(
            json!(1),
            &argv(&["echo", "a;b", "$HOME"]),
            Duration::from_secs(10),
            None,
            1024,
        );
        assert_eq!(r["exit"], 0);
        assert_eq!(r["stdout"], "a;b $HOME\n");
        let r = run(
            json!(2),
            &argv(&["sh", "-c", "echo err >&2; exit 3"]),
            Duration::from_secs(10),
            None,
            1024,
        );
        assert_eq!(r["exit"], 3);
        assert_eq!(r["stderr"], "err\n");
    }

    #[test]
    fn feeds_stdin_and_bounds_output() {
        let r = run(
            json!(1),
            &argv(&["cat"]),
            Duration::from_secs(10),
            Some("hello"),
            1024,
        );
        assert_eq!(r["stdout"], "hello");
        let r = run(
            json!(1),
            &argv(&["head", "-c", "5000", "/dev/zero"]),
            Duration::from_secs(10),
            None,
            100,
        );
        assert_eq!(r["stdout"].as_str().unwrap().len(), 100);
        assert_eq!(r["truncated"], true);
    }

    #[test]
    fn kills_the_whole_group_on_timeout() {
        let r = run(
            json!(1),
            &argv(&["sh", "-c", "sleep 30 & sleep 30"]),
            Duration::from_millis(200),
            None,
            1024,
        );
        assert_eq!(r["timed_out"], true);
        assert_eq!(r["exit"], 128 + 9);
    }

    #[test]
    fn a_missing_program_is_exit_127() {
        let r = run(
            json!(1),
            &argv(&["/nonexistent/prog"]),
            Duration::from_secs(1),
            None,
            1024,
        );
        assert_eq!(r["exit"], 127);
        assert!(r["stderr"].as_str().unwrap().contains("cannot run"));
    }

    #[test]
    fn wait_sees_a_file_change_and_reads_extra_files() {
        let dir = std::env::temp_dir().join(format!("agent-wait-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("carrier");
        let g = dir.join("operstate");
        std::fs::write(&f, "1\n").unwrap();
        std::fs::write(&g, "down\n").unwrap();
        let f2 = f.clone();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            std::fs::write(&f2, "0\n").unwrap();
        });
        let line = json!({"id": 9, "wait": {"all": [{"path": f, "equals": "0"}], "timeout": 10,
            "read": [g]}})
        .to_string();
        let r = handle(&line);
        t.join().unwrap();
        assert_eq!(r["exit"], 0, "{r}");
        assert_eq!(r["values"][f.to_str().unwrap()], "0");
        assert_eq!(r["read"][g.to_str().unwrap()], "down");
        let line =
            json!({"id": 10, "wait": {"all": [{"path": f, "not_equals": "0"}], "timeout": 0.05}})
                .to_string();
        let r = handle(&line);
        assert_eq!(r["exit"], 1);
        assert_eq!(r["timed_out"], true);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[derive(Clone, Default)]
    struct Sink(Arc<Mutex<Vec<u8>>>);
    impl Write for Sink {
        fn write(&mut self, b: &[u8]) -> io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn serve_says_hello_then_answers_every_line_by_id() {
        let input = "{\"id\":1,\"argv\":[\"true\"]}\n\n{\"id\":2,\"argv\":[\"false\"]}\ngarbage\n";
        let sink = Sink::default();
        let n = serve(Cursor::new(input), sink.clone()).unwrap();
        assert_eq!(n, 3);
        let text = String::from_utf8(sink.0.lock().unwrap().clone()).unwrap();
        let lines: Vec<Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 4);
        assert_eq!(lines[0]["ready"], true);
        let by_id: BTreeMap<String, i64> = lines[1..]
            .iter()
            .map(|v| (v["id"].to_string(), v["exit"].as_i64().unwrap()))
            .collect();
        assert_eq!(by_id["1"], 0);
        assert_eq!(by_id["2"], 1);
        assert_eq!(by_id["null"], -1);
    }
}
