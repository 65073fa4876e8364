//! `robustness`: runs the robustness harness (see testkit::robustness).
//!
//! ```text
//! cargo run --release -p testkit --bin robustness -- \
//!     --seed N --runs K --profile ci|full --traffic kv|kubernetes|leases|all \
//!     [--oxcd PATH] [--failpoints] [--broken-server] [--fault NAME] \
//!     [--out DIR] [--keep-histories]
//! robustness --check FILE
//! ```
//!
//! Runs seeds N, N+1, …, N+K-1 for each traffic kind asked, prints a line
//! per run and a summary (runs, operations, faults by kind, violations),
//! and exits 1 if any run broke a guarantee. A failed run's history is
//! saved under --out (default: the system temp dir) for `--check`.
//! `--broken-server` inverts the verdict: each run must be caught.
//! Needs root (network namespaces) and an oxcd binary: --oxcd, $OXCD_BIN,
//! or target/<profile>/oxcd next to this binary; --failpoints says it was
//! built with `--features failpoints` (crash points join the faults).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use testkit::robustness::check::{check, Report};
use testkit::robustness::faults::Fault;
use testkit::robustness::history::History;
use testkit::robustness::run::{history_path, run, Profile, RunConfig};
use testkit::robustness::traffic::TrafficKind;

struct Args {
    seed: u64,
    runs: u64,
    profile: Profile,
    traffic: Vec<TrafficKind>,
    failpoints: bool,
    broken_server: bool,
    fault: Option<Fault>,
    out: PathBuf,
    keep: bool,
    check: Option<PathBuf>,
}

fn usage(problem: &str) -> ! {
    eprintln!("robustness: {problem}");
    eprintln!(
        "usage: robustness [--seed N] [--runs K] [--profile ci|full] [--traffic kv|kubernetes|leases|all] \
[--oxcd PATH] [--failpoints] [--broken-server] [--fault NAME] [--out DIR] [--keep-histories]\n       robustness --check FILE"
    );
    std::process::exit(2)
}

fn parse_args() -> Args {
    let mut args = Args {
        seed: 1,
        runs: 1,
        profile: Profile::Ci,
        traffic: vec![
            TrafficKind::Kv,
            TrafficKind::Kubernetes,
            TrafficKind::Leases,
        ],
        failpoints: false,
        broken_server: false,
        fault: None,
        out: std::env::temp_dir(),
        keep: false,
        check: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = |name: &str| {
            it.next()
                .unwrap_or_else(|| usage(&format!("{name} needs a value")))
        };
        match flag.as_str() {
            "--seed" => {
                args.seed = value("--seed")
                    .parse()
                    .unwrap_or_else(|_| usage("--seed: a number"))
            }
            "--runs" => {
                args.runs = value("--runs")
                    .parse()
                    .unwrap_or_else(|_| usage("--runs: a number"))
            }
            "--profile" => {
                args.profile = Profile::parse(&value("--profile"))
                    .unwrap_or_else(|| usage("--profile: ci or full"))
            }
            "--traffic" => {
                let v = value("--traffic");
                args.traffic = if v == "all" {
                    vec![
                        TrafficKind::Kv,
                        TrafficKind::Kubernetes,
                        TrafficKind::Leases,
                    ]
                } else {
                    vec![TrafficKind::parse(&v)
                        .unwrap_or_else(|| usage("--traffic: kv, kubernetes, leases or all"))]
                }
            }
            "--oxcd" => {
                let path = PathBuf::from(value("--oxcd"));
                std::env::set_var("OXCD_BIN", std::fs::canonicalize(&path).unwrap_or(path))
            }
            "--failpoints" => args.failpoints = true,
            "--broken-server" => args.broken_server = true,
            "--fault" => {
                let v = value("--fault");
                args.fault =
                    Some(Fault::parse(&v).unwrap_or_else(|| usage(&format!("unknown fault {v}"))))
            }
            "--out" => args.out = PathBuf::from(value("--out")),
            "--keep-histories" => args.keep = true,
            "--check" => args.check = Some(PathBuf::from(value("--check"))),
            other => usage(&format!("unknown argument {other}")),
        }
    }
    args
}

fn print_report(report: &Report) {
    for v in &report.violations {
        println!("  VIOLATION: {v}");
    }
    for w in &report.warnings {
        println!("  warning: {w}");
    }
}

fn main() -> ExitCode {
    let args = parse_args();
    if let Some(file) = &args.check {
        let history = match History::load(file) {
            Ok(h) => h,
            Err(e) => {
                eprintln!("robustness: cannot read {}: {e}", file.display());
                return ExitCode::from(2);
            }
        };
        let report = check(&history);
        println!(
            "{}: seed {} traffic {}: {} operations, {} violations",
            file.display(),
            history.seed,
            history.traffic,
            report.operations,
            report.violations.len()
        );
        print_report(&report);
        return if report.violations.is_empty() {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        };
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("robustness: needs root (network namespaces, tmpfs)");
        return ExitCode::from(2);
    }
    if std::env::var_os("OXCD_BIN").is_none() {
        // target/<profile>/robustness: oxcd is its neighbour
        if let Some(dir) = std::env::current_exe()
            .ok()
            .and_then(|e| e.parent().map(|d| d.to_path_buf()))
        {
            std::env::set_var("OXCD_BIN", dir.join("oxcd"));
        }
    }
    let oxcd = testkit::oxcd_bin();
    if !oxcd.exists() {
        eprintln!(
            "robustness: no oxcd at {} (build it, or give --oxcd PATH)",
            oxcd.display()
        );
        return ExitCode::from(2);
    }
    let started = Instant::now();
    let (mut runs, mut operations, mut unknown, mut failed) = (0u64, 0usize, 0usize, 0u64);
    let mut watch_events = 0usize;
    let mut faults: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    let mut violations_total = 0usize;
    for traffic in &args.traffic {
        for seed in args.seed..args.seed + args.runs {
            let config = RunConfig {
                seed,
                traffic: *traffic,
                profile: args.profile,
                failpoints: args.failpoints,
                broken_server: args.broken_server,
                fault: args.fault,
            };
            let run_started = Instant::now();
            let history = run(&config);
            let report = check(&history);
            runs += 1;
            operations += report.operations;
            unknown += report.unknown;
            watch_events += report.watch_events;
            for f in &history.faults {
                let entry = faults.entry(f.kind.clone()).or_default();
                entry.0 += 1;
                if f.detail.contains("not reached")
                    || f.detail.contains("could not")
                    || f.detail.contains("skipped")
                {
                    entry.1 += 1;
                }
            }
            let caught = !report.violations.is_empty();
            let bad = caught != args.broken_server;
            violations_total += report.violations.len();
            println!(
                "run {} seed {seed}: {} ops ({} unknown), {} checked for linearizability, {} reads against the log, {} watch events, {} warnings; faults: {}; {:.1}s; {}",
                traffic.name(),
                report.operations,
                report.unknown,
                report.linearizability_ops,
                report.reads_checked_against_log,
                report.watch_events,
                report.warnings.len(),
                history
                    .faults
                    .iter()
                    .map(|f| format!("{} on m{} [{}]", f.kind, f.member + 1, f.detail))
                    .collect::<Vec<_>>()
                    .join(", "),
                run_started.elapsed().as_secs_f64(),
                match (caught, args.broken_server) {
                    (false, false) => "ok".to_string(),
                    (true, false) => format!("{} VIOLATIONS", report.violations.len()),
                    (true, true) => format!("broken server caught ({} violations)", report.violations.len()),
                    (false, true) => "broken server NOT caught".to_string(),
                }
            );
            if bad || caught {
                print_report(&report);
            }
            if bad {
                failed += 1;
            }
            if bad || args.keep {
                let path = history_path(&args.out, &config);
                match history.save(&path) {
                    Ok(()) => println!(
                        "  history saved: {} (check it again with --check)",
                        path.display()
                    ),
                    Err(e) => println!("  history not saved: {e}"),
                }
            }
        }
    }
    println!(
        "summary: {runs} runs, {operations} operations ({unknown} unknown), {watch_events} watch events, {:.0}s",
        started.elapsed().as_secs_f64()
    );
    let by_kind: Vec<String> = faults
        .iter()
        .map(|(k, (n, missed))| {
            if *missed > 0 {
                format!("{k} {n} ({missed} not reached)")
            } else {
                format!("{k} {n}")
            }
        })
        .collect();
    println!(
        "faults: {}",
        if by_kind.is_empty() {
            "none".into()
        } else {
            by_kind.join(", ")
        }
    );
    println!(
        "violations: {violations_total}; runs failed: {failed}{}",
        if args.broken_server {
            " (broken server: a run fails when it is NOT caught)"
        } else {
            ""
        }
    );
    if failed > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
