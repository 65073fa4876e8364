//! Where log lines go (`--log-outputs`): stderr, stdout, files (rotated
//! or not) or journald, every line to each, as zap's combined write
//! syncers write it. The formatter hands each line over in one write.

use std::fs::File;
use std::io::{self, Write};
use std::sync::Arc;

use parking_lot::Mutex;
use tracing::{Level, Metadata};
use tracing_subscriber::fmt::MakeWriter;

use super::journal::JournalWriter;
use super::rotate::RotatingFile;

pub(crate) enum Output {
    Stderr,
    Stdout,
    File(Mutex<File>),
    Rotating(Mutex<RotatingFile>),
    Journal(JournalWriter),
}

/// Every output of the logger, shared by every thread that logs.
#[derive(Clone)]
pub(crate) struct Outputs(Arc<Vec<Output>>);

impl Outputs {
    pub(crate) fn new(outputs: Vec<Output>) -> Outputs {
        Outputs(Arc::new(outputs))
    }

    fn has_journal(&self) -> bool {
        self.0.iter().any(|o| matches!(o, Output::Journal(_)))
    }
}

/// One line's writer: the outputs, and for journald the line's level and
/// the caller's package.
pub(crate) struct LineWriter<'a> {
    outputs: &'a Outputs,
    level: Level,
    package: String,
}

impl<'a> MakeWriter<'a> for Outputs {
    type Writer = LineWriter<'a>;

    fn make_writer(&'a self) -> LineWriter<'a> {
        LineWriter {
            outputs: self,
            level: Level::INFO,
            package: String::new(),
        }
    }

    fn make_writer_for(&'a self, meta: &Metadata<'_>) -> LineWriter<'a> {
        let package = if self.has_journal() {
            package_of(&super::caller(meta))
        } else {
            String::new()
        };
        LineWriter {
            outputs: self,
            level: *meta.level(),
            package,
        }
    }
}

/// etcd's `filepath.Dir(caller)`: `etcdserver/server.go:12` → `etcdserver`.
fn package_of(caller: &str) -> String {
    match caller.rfind('/') {
        Some(slash) => caller[..slash].to_string(),
        None => ".".to_string(),
    }
}

impl Write for LineWriter<'_> {
    /// Writes the line to every output; a failing output does not keep it
    /// from the others (zap reports such failures to the same outputs,
    /// which here would be no better off).
    fn write(&mut self, line: &[u8]) -> io::Result<usize> {
        for output in self.outputs.0.iter() {
            let _ = match output {
                Output::Stderr => io::stderr().lock().write_all(line),
                Output::Stdout => io::stdout().lock().write_all(line),
                Output::File(file) => file.lock().write_all(line),
                Output::Rotating(file) => file.lock().write_all(line),
                Output::Journal(journal) => {
                    journal.write_line(line, self.level, &self.package);
                    Ok(())
                }
            };
        }
        Ok(line.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_callers_package_is_its_directory() {
        assert_eq!(super::package_of("etcdserver/server.rs:12"), "etcdserver");
        assert_eq!(
            super::package_of("consensus/node/core.rs:1"),
            "consensus/node"
        );
        assert_eq!(super::package_of("main.rs:3"), ".");
    }
}
