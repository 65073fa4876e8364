//! oxctl: offline tools for oxcd data, as etcdutl is for etcd.

use std::process::ExitCode;

fn main() -> ExitCode {
    let mut stdout = std::io::stdout().lock();
    match oxctl::run(std::env::args_os(), &mut stdout) {
        Ok(()) => ExitCode::SUCCESS,
        Err(oxctl::CliError::Usage(e)) => {
            // clap prints help and version to stdout with success.
            let code = if e.use_stderr() { 1 } else { 0 };
            let _ = e.print();
            ExitCode::from(code)
        }
        Err(e) => {
            // etcdutl's (cobra's) error line and exit status.
            eprintln!("Error: {e}");
            ExitCode::from(1)
        }
    }
}
