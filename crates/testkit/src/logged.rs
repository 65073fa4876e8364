//! Running a server binary for what it logs: start it with a clean
//! environment, read its stderr until a line shows up or it exits.

use std::ffi::OsStr;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A line no process logs: [`run_until`] then reads until the process exits
/// (or the deadline passes).
pub const UNTIL_EXIT: &str = "\u{0}";

/// `bin` with nothing from the test's environment but a PATH (so that no
/// `ETCD_*` variable of the machine leaks in), stdin and stdout null,
/// stderr piped for [`run_until`].
pub fn clean_command(bin: impl AsRef<OsStr>) -> Command {
    let mut cmd = Command::new(bin);
    cmd.env_clear()
        .env("PATH", "/usr/bin:/bin")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    cmd
}

/// Spawns `cmd` (stderr piped) and reads its log lines until one contains
/// `until`, it exits, or `within` passes; then kills it. Its lines and exit
/// code (None when killed).
pub fn run_until(mut cmd: Command, until: &str, within: Duration) -> (Vec<String>, Option<i32>) {
    let mut child = cmd.spawn().expect("the command starts");
    let stderr = child.stderr.take().expect("stderr is piped");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let deadline = Instant::now() + within;
    let mut lines = Vec::new();
    while let Ok(line) = rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
        let done = line.contains(until);
        lines.push(line);
        if done {
            break;
        }
    }
    let _ = child.kill();
    let status = child.wait().expect("the command is reaped");
    (lines, status.code())
}
