//! oxbench's command line as the bench scripts use it. Having an integration
//! test also makes `cargo test --workspace` build target/debug/oxbench, the
//! binary bench/smoke.sh runs in CI.

use std::process::Command;
use std::time::{Duration, Instant};

fn oxbench() -> Command {
    Command::new(env!("CARGO_BIN_EXE_oxbench"))
}

#[test]
fn help_lists_every_workload_the_bench_scripts_use() {
    let out = oxbench()
        .arg("--help")
        .output()
        .expect("run oxbench --help");
    assert!(out.status.success(), "oxbench --help: {out:?}");
    let help = String::from_utf8_lossy(&out.stdout);
    for workload in [
        "put",
        "range",
        "txn-put",
        "watch-latency",
        "lease-expire",
        "failover",
        "health",
    ] {
        assert!(
            help.lines()
                .any(|l| l.trim_start().starts_with(&format!("{workload} "))),
            "oxbench --help does not list {workload}:\n{help}"
        );
    }
}

/// The scripts ask `oxbench health` whether something already answers on a
/// port before they start a server there: with nothing listening it must
/// fail, and within its timeout.
#[test]
fn health_fails_within_its_timeout_when_nothing_listens() {
    let started = Instant::now();
    let out = oxbench()
        .args([
            "--endpoints",
            "127.0.0.1:1",
            "--dial-timeout",
            "200ms",
            "health",
            "--timeout",
            "500ms",
        ])
        .output()
        .expect("run oxbench health");
    assert!(
        !out.status.success(),
        "oxbench health succeeded with nothing listening: {out:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "oxbench health took {:?}",
        started.elapsed()
    );
}
