//! `phyfarm-agent [--port PATH]`: serve JSON-line requests on the
//! virtio-serial port named org.phyfarm.agent (or PATH), forever.

use std::io::BufReader;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use guest_agent::{serve, PORT_NAME};

/// The /dev node of the virtio port called `name`, once it exists.
fn find_port(name: &str, patience: Duration) -> Option<PathBuf> {
    let start = Instant::now();
    loop {
        if let Ok(rd) = std::fs::read_dir("/sys/class/virtio-ports") {
            for e in rd.flatten() {
                let n = std::fs::read_to_string(e.path().join("name")).unwrap_or_default();
                let dev = PathBuf::from("/dev").join(e.file_name());
                if n.trim() == name && dev.exists() {
                    return Some(dev);
                }
            }
        }
        if start.elapsed() > patience {
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let port = match args.get(1).map(String::as_str) {
        Some("--port") => args.get(2).map(PathBuf::from),
        Some("-h" | "--help") => {
            println!("usage: phyfarm-agent [--port PATH]\nServes JSON-line requests on the virtio port {PORT_NAME}.");
            return;
        }
        Some(other) => {
            eprintln!("phyfarm-agent: unknown argument {other}");
            std::process::exit(2);
        }
        None => find_port(PORT_NAME, Duration::from_secs(30)),
    };
    let Some(port) = port else {
        eprintln!("phyfarm-agent: no virtio port named {PORT_NAME}");
        std::process::exit(2);
    };
    // The host may connect and go away; reopen the port and greet again.
    loop {
        let opened = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&port)
            .and_then(|f| Ok((f.try_clone()?, f)));
        match opened {
            Ok((r, w)) => {
                if let Err(e) = serve(BufReader::new(r), w) {
                    eprintln!("phyfarm-agent: {}: {e}", port.display());
                }
            }
            Err(e) => eprintln!("phyfarm-agent: cannot open {}: {e}", port.display()),
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}
