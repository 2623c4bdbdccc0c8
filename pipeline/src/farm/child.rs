//! Children that end with phyfarm.

use std::process::Command;

/// The child gets SIGTERM when the thread that starts it ends, however
/// that happens: a SIGINT or SIGKILL sent to phyfarm alone (not to its
/// process group, as a terminal's Ctrl-C is) otherwise left pytest, and with
/// it every guest and emulator, running. The harness ends its own children
/// on SIGTERM.
pub fn ends_with_this_thread(cmd: &mut Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: getpid is async-signal-safe; `parent` is a plain integer.
    let parent = unsafe { libc::getpid() };
    // SAFETY: prctl, getppid and raise are async-signal-safe, and the
    // closure touches nothing but its copy of `parent`.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The parent ended before the call: nobody would send it now.
            if libc::getppid() != parent {
                libc::raise(libc::SIGTERM);
            }
            Ok(())
        });
    }
}

/// `Command::new(program)` that [`ends_with_this_thread`].
pub fn ending_with_this_thread(program: &str) -> Command {
    let mut cmd = Command::new(program);
    ends_with_this_thread(&mut cmd);
    cmd
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_child_ends_with_the_thread_that_started_it() {
        use std::os::unix::process::ExitStatusExt;
        // The thread starts `sleep` and ends without waiting, as phyfarm
        // does when it is killed: the child must not stay.
        let child = std::thread::spawn(|| {
            let mut cmd = Command::new("sleep");
            cmd.arg("30");
            ends_with_this_thread(&mut cmd);
            cmd.spawn().unwrap()
        })
        .join()
        .unwrap();
        let mut child = child;
        let status = child.wait().unwrap();
        assert_eq!(status.signal(), Some(libc::SIGTERM), "{status:?}");
    }
}
