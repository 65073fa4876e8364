//! etcd's flags and `ETCD_*` variables: every flag of etcd 3.5.16's and
//! 3.5.1's `--help` is taken, with etcd's defaults, and the variables
//! follow etcd's rules (pkg/flags `SetFlagsFromEnv`, `verifyEnv`).

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use oxcd::flags::{self, Parsed};
use testkit::{logged, Process};

const REFERENCES: [&str; 2] = ["/opt/etcd-3.5.16/etcd", "/opt/etcd-3.5.1/etcd"];

/// A reference binary's `--help`, or None (with a message) when it is not
/// installed (`../shared/tools/ref-etcd --bin 3.5.16`, `--bin 3.5`).
fn reference_help(bin: &str) -> Option<String> {
    if !Path::new(bin).exists() {
        eprintln!("skipping {bin}: not installed");
        return None;
    }
    let out = Command::new(bin).arg("--help").output().expect("runs");
    Some(String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr))
}

/// Each flag's header line in a help text: ("name", "--name 'default'").
fn help_flags(help: &str) -> Vec<(String, String)> {
    help.lines()
        .filter(|l| l.starts_with("  --"))
        .map(|l| {
            let header = l.trim().to_string();
            let name = header[2..]
                .split(|c: char| c.is_whitespace())
                .next()
                .unwrap_or_default()
                .to_string();
            (name, header)
        })
        .collect()
}

/// The value to give `--name`: the default etcd's help shows, else oxcd's.
fn default_value(name: &str, header: &str) -> Option<String> {
    let spec = flags::spec(name)?;
    let shown = header.split_once(' ').map(|(_, shown)| {
        let shown = shown.strip_prefix('\'').unwrap_or(shown);
        shown.strip_suffix('\'').unwrap_or(shown).to_string()
    });
    Some(match shown {
        // '' stands for Go's zero duration in etcd's help
        Some(v) if v.is_empty() && !spec.default.is_empty() => spec.default.to_string(),
        Some(v) if v != "${name}.etcd" && v != "math.MaxUint32" => v,
        _ => spec.default.to_string(),
    })
}

fn parse(args: &[String], env: &[(String, String)]) -> Result<Box<flags::Flags>, String> {
    match flags::parse(args, env) {
        Ok(Parsed::Run(flags)) => Ok(flags),
        Ok(other) => Err(format!("{other:?}")),
        Err(e) => Err(e.message),
    }
}

#[test]
fn every_flag_of_etcds_help_is_taken_at_its_default() {
    let mut seen = BTreeSet::new();
    for bin in REFERENCES {
        let Some(help) = reference_help(bin) else {
            continue;
        };
        let listed = help_flags(&help);
        assert!(listed.len() >= 90, "{bin}: only {} flags", listed.len());
        for (name, header) in listed {
            let value = default_value(&name, &header)
                .unwrap_or_else(|| panic!("oxcd does not know --{name} ({bin})"));
            // etcd: listening URLs given need advertised ones
            let companion = (name == "listen-client-urls")
                .then_some(("advertise-client-urls", "http://localhost:2379"));
            let mut args = vec![format!("--{name}={value}")];
            let mut env = vec![(flags::env_name(&name), value.clone())];
            if let Some((other, value)) = companion {
                args.push(format!("--{other}={value}"));
                env.push((flags::env_name(other), value.to_string()));
            }
            let arg = args.join(" ");
            let flags = parse(&args, &[]).unwrap_or_else(|e| panic!("{arg} refused: {e}"));
            oxcd::config_from(&flags).unwrap_or_else(|e| panic!("{arg} refused: {e}"));
            // and through its variable
            let flags = parse(&[], &env).unwrap_or_else(|e| panic!("{env:?} refused: {e}"));
            oxcd::config_from(&flags).unwrap_or_else(|e| panic!("{env:?} refused: {e}"));
            seen.insert(name);
        }
    }
    // the flags etcd 3.5 takes without listing them
    for arg in [
        "--experimental-snapshot-catchup-entries=5000",
        "--config-file=",
        "--version=false",
    ] {
        parse(&[arg.to_string()], &[]).unwrap_or_else(|e| panic!("{arg} refused: {e}"));
    }
    eprintln!("{} flags checked", seen.len());
}

#[test]
fn oxcd_help_shows_etcds_defaults_in_etcds_groups() {
    let Some(help) = reference_help(REFERENCES[0]) else {
        return;
    };
    let ours = flags::help_text(flags::specs());
    let our_headers: Vec<(String, String)> = help_flags(&ours);
    for (name, header) in help_flags(&help) {
        let Some((_, mine)) = our_headers.iter().find(|(n, _)| *n == name) else {
            panic!("--{name} is not in oxcd --help");
        };
        if name == "data-dir" {
            assert_eq!(mine, "--data-dir '${name}.oxcd'");
            continue;
        }
        assert_eq!(mine, &header, "--{name}'s default");
    }
    let titles = |text: &str| -> Vec<String> {
        text.lines()
            .filter(|l| !l.starts_with(' ') && l.ends_with(':') && *l != "Usage:")
            .map(String::from)
            .collect()
    };
    assert_eq!(titles(&ours), titles(&help));
}

/// Runs oxcd on a fresh data dir and loopback port 0 with `args` and
/// `env` until it logs `until` or exits; its log lines and exit code.
fn run_until(args: &[&str], env: &[(&str, &str)], until: &str) -> (Vec<String>, Option<i32>) {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = logged::clean_command(testkit::oxcd_bin());
    cmd.arg("--data-dir")
        .arg(dir.path())
        .args(["--listen-client-urls", "http://127.0.0.1:0"])
        .args(["--advertise-client-urls", "http://127.0.0.1:0"])
        .args(["--listen-peer-urls", "http://127.0.0.1:0"])
        .args(["--initial-advertise-peer-urls", "http://127.0.0.1:0"])
        .args(args)
        .envs(env.iter().copied());
    logged::run_until(cmd, until, Duration::from_secs(30))
}

fn line_with<'a>(lines: &'a [String], needle: &str) -> Option<&'a String> {
    lines.iter().find(|l| l.contains(needle))
}

#[test]
fn enable_v2_true_starts_and_warns_that_v2_is_not_served() {
    let dir = tempfile::tempdir().unwrap();
    // Patroni's way of starting etcd
    let mut m = Process::start_oxcd(&testkit::oxcd_bin(), dir.path(), &["--enable-v2=true"]);
    let warning = m
        .wait_for_log("flag has no effect in oxcd", Duration::from_secs(1))
        .unwrap_or_else(|| panic!("no warning; log:\n{}", m.log_text()));
    assert_eq!(
        testkit::json_field(&warning, "flag").as_deref(),
        Some("--enable-v2")
    );
    assert!(warning.contains("\"level\":\"warn\""), "{warning}");
    assert!(warning.contains("no v2 API"), "{warning}");
    m.terminate(Duration::from_secs(20));

    let (lines, _) = run_until(
        &[],
        &[("ETCD_ENABLE_V2", "true")],
        "ready to serve client requests",
    );
    assert!(
        line_with(&lines, "ready to serve client requests").is_some(),
        "{lines:#?}"
    );
    let used = line_with(&lines, "recognized and used environment variable").expect("logged");
    assert!(
        used.contains("\"variable-name\":\"ETCD_ENABLE_V2\""),
        "{used}"
    );
    assert!(line_with(&lines, "flag has no effect in oxcd").is_some());
}

#[test]
fn an_unknown_etcd_variable_is_warned_about() {
    let (lines, _) = run_until(
        &[],
        &[("ETCD_NO_SUCH_FLAG", "1")],
        "ready to serve client requests",
    );
    let warning = line_with(&lines, "unrecognized environment variable")
        .unwrap_or_else(|| panic!("{lines:#?}"));
    assert_eq!(
        testkit::json_field(warning, "environment-variable").as_deref(),
        Some("ETCD_NO_SUCH_FLAG=1")
    );
    assert!(line_with(&lines, "ready to serve client requests").is_some());
}

#[test]
fn a_variable_shadowed_by_a_command_line_flag_is_fatal() {
    let (lines, code) = run_until(
        &["--snapshot-count", "10"],
        &[("ETCD_SNAPSHOT_COUNT", "20")],
        "ready to serve client requests",
    );
    assert_eq!(code, Some(1), "{lines:#?}");
    let fatal = line_with(
        &lines,
        "conflicting environment variable is shadowed by corresponding command-line flag (either unset environment variable or disable flag))",
    )
    .unwrap_or_else(|| panic!("{lines:#?}"));
    assert_eq!(
        testkit::json_field(fatal, "environment-variable").as_deref(),
        Some("ETCD_SNAPSHOT_COUNT")
    );
    assert!(line_with(&lines, "ready to serve client requests").is_none());
}

#[test]
fn etcd_version_cannot_be_set() {
    let (lines, _) = run_until(
        &[],
        &[("ETCD_VERSION", "3.5.0")],
        "ready to serve client requests",
    );
    let warning = line_with(&lines, "cannot set special environment variable")
        .unwrap_or_else(|| panic!("{lines:#?}"));
    assert_eq!(
        testkit::json_field(warning, "key").as_deref(),
        Some("ETCD_VERSION")
    );
    // not taken as --version: the member starts
    assert!(line_with(&lines, "ready to serve client requests").is_some());
}

#[test]
fn a_bad_variable_is_refused_with_etcds_words() {
    let (lines, code) = run_until(&[], &[("ETCD_SNAPSHOT_COUNT", "many")], "never");
    assert_eq!(code, Some(1), "{lines:#?}");
    let refused =
        line_with(&lines, "failed to verify flags").unwrap_or_else(|| panic!("{lines:#?}"));
    assert!(
        refused.contains(r#"invalid value \"many\" for ETCD_SNAPSHOT_COUNT: parse error"#),
        "{refused}"
    );
}

#[test]
fn a_member_starts_with_every_flag_etcd_lists_at_its_default() {
    let Some(help) = reference_help(REFERENCES[0]) else {
        return;
    };
    // the URLs, data dir and initial cluster are the harness's own
    let own = [
        "data-dir",
        "listen-client-urls",
        "advertise-client-urls",
        "listen-peer-urls",
        "initial-advertise-peer-urls",
        "initial-cluster",
    ];
    let args: Vec<String> = help_flags(&help)
        .into_iter()
        .filter(|(name, _)| !own.contains(&name.as_str()))
        .map(|(name, header)| {
            let value = default_value(&name, &header).expect("known");
            format!("--{name}={value}")
        })
        .collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (lines, _) = run_until(&args, &[], "ready to serve client requests");
    assert!(
        line_with(&lines, "ready to serve client requests").is_some(),
        "{lines:#?}"
    );
    // each no-effect flag given is logged once
    let warned: Vec<String> = lines
        .iter()
        .filter(|l| l.contains("flag has no effect in oxcd"))
        .filter_map(|l| testkit::json_field(l, "flag"))
        .collect();
    let unique: BTreeSet<&String> = warned.iter().collect();
    assert_eq!(unique.len(), warned.len(), "{warned:?}");
    assert!(warned.contains(&"--backend-bbolt-freelist-type".to_string()));
}

#[test]
fn enable_grpc_gateway_false_takes_the_json_gateway_away() {
    let body = r#"{"key":"YQ=="}"#;
    let dir = tempfile::tempdir().unwrap();
    let mut on = Process::start_oxcd(&testkit::oxcd_bin(), dir.path(), &[]);
    let answer = testkit::http::post(&on.endpoint, "/v3/kv/range", body).expect("answers");
    assert_eq!(answer.status, 200, "{answer:?}");
    on.terminate(Duration::from_secs(20));
    let mut off = Process::start_oxcd(
        &testkit::oxcd_bin(),
        dir.path(),
        &["--enable-grpc-gateway=false"],
    );
    // etcd 3.5.16 answers 404 too
    let answer = testkit::http::post(&off.endpoint, "/v3/kv/range", body).expect("answers");
    assert_eq!(answer.status, 404, "{answer:?}");
    // the rest of the HTTP routes stay
    let health = testkit::http::get(&off.endpoint, "/health").expect("answers");
    assert_eq!(health.status, 200, "{health:?}");
    off.terminate(Duration::from_secs(20));
}

#[test]
fn socket_reuse_port_lets_two_members_listen_on_one_client_port() {
    let port = testkit::free_port();
    let url = format!("http://127.0.0.1:{port}");
    let start = |dir: &Path, extra: &[&str]| {
        let mut args = vec![
            "--listen-client-urls",
            url.as_str(),
            "--advertise-client-urls",
            url.as_str(),
            "--listen-peer-urls",
            "http://127.0.0.1:0",
            "--initial-advertise-peer-urls",
            "http://127.0.0.1:0",
        ];
        args.extend_from_slice(extra);
        Process::launch_oxcd_args(&testkit::oxcd_bin(), dir, &url, &args)
    };
    let (a, b, c) = (
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
    );
    let mut first = start(a.path(), &["--socket-reuse-port"]);
    assert!(
        first
            .wait_for_log("ready to serve client requests", Duration::from_secs(30))
            .is_some(),
        "{}",
        first.log_text()
    );
    let mut second = start(b.path(), &["--socket-reuse-port=true"]);
    assert!(
        second
            .wait_for_log("ready to serve client requests", Duration::from_secs(30))
            .is_some(),
        "{}",
        second.log_text()
    );
    // without it, the port is taken
    let mut third = start(c.path(), &[]);
    let status = third.wait_exit(Duration::from_secs(30)).expect("exits");
    assert!(!status.success());
    assert!(third.log_text().contains("in use"), "{}", third.log_text());
    first.terminate(Duration::from_secs(20));
    second.terminate(Duration::from_secs(20));
}
