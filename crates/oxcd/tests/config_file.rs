//! etcd's `--config-file` (and `ETCD_CONFIG_FILE`), against the real
//! binary: etcd.conf.yml.sample's keys start a member with those values,
//! every other flag and variable is ignored (with etcd's log line), the TLS
//! sections give a TLS client port, and a malformed file is refused as
//! etcd 3.5.16 refuses it.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use testkit::logged::{self, UNTIL_EXIT};
use testkit::pki::{TestCa, Usage};
use testkit::{json_field, oxcd_bin, Process, START_DEADLINE};

const REFERENCE: &str = "/opt/etcd-3.5.16/etcd";
const LOADED: &str = "loaded server configuration, other configuration command line flags and environment variables will be ignored if provided";

/// etcd's sample with this member's name, data dir and loopback URLs on
/// port 0 (`client` is the client URL's scheme), at info level.
fn sample(name: &str, data_dir: &Path, client: &str) -> String {
    let sample = include_str!("fixtures/etcd.conf.yml.sample");
    let client_url = format!("{client}://127.0.0.1:0");
    sample
        .replace("name: 'default'", &format!("name: '{name}'"))
        .replace(
            "data-dir:\n",
            &format!("data-dir: {}\n", data_dir.display()),
        )
        .replace("http://localhost:2379", &client_url)
        .replace("http://localhost:2380", "http://127.0.0.1:0")
        .replace(
            "initial-cluster:\n",
            &format!("initial-cluster: {name}=http://127.0.0.1:0\n"),
        )
        .replace("log-level: debug", "log-level: info")
}

/// Runs `bin` with `args` and `env` (nothing else from the test's
/// environment) until it logs `until` or exits; its log lines and exit
/// code.
fn run_until(
    bin: &str,
    args: &[&str],
    env: &[(&str, &str)],
    until: &str,
) -> (Vec<String>, Option<i32>) {
    let mut cmd = logged::clean_command(bin);
    cmd.args(args).envs(env.iter().copied());
    logged::run_until(cmd, until, START_DEADLINE)
}

fn line_with<'a>(lines: &'a [String], needle: &str) -> &'a String {
    lines
        .iter()
        .find(|l| l.contains(needle))
        .unwrap_or_else(|| panic!("no {needle:?} in\n{}", lines.join("\n")))
}

fn member_names(endpoint: &str) -> Vec<String> {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let mut client = etcd_client::Client::connect([endpoint], None)
            .await
            .unwrap();
        let members = client.member_list().await.unwrap();
        members
            .members()
            .iter()
            .map(|m| m.name().to_string())
            .collect()
    })
}

#[test]
fn etcds_sample_starts_a_member_with_its_values_and_ignores_flags() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("from-file.data");
    let file = dir.path().join("etcd.conf.yml");
    std::fs::write(&file, sample("from-file", &data, "http")).unwrap();
    let flag_data = dir.path().join("from-flag.data");
    // launch_oxcd_args passes --data-dir too: ignored as the rest
    let m = Process::launch_oxcd_args(
        &oxcd_bin(),
        &flag_data,
        "",
        &[
            "--config-file",
            file.to_str().unwrap(),
            "--name",
            "from-flag",
            "--snapshot-count",
            "5",
        ],
    );
    let address = m
        .wait_for_log("serving client traffic", START_DEADLINE)
        .and_then(|line| json_field(&line, "address"))
        .unwrap_or_else(|| panic!("not serving; log:\n{}", m.log_text()));
    m.wait_for_log("ready to serve client requests", START_DEADLINE)
        .unwrap_or_else(|| panic!("not ready; log:\n{}", m.log_text()));
    let loaded = m.wait_for_log(LOADED, Duration::ZERO).expect("etcd's line");
    assert_eq!(json_field(&loaded, "path").as_deref(), file.to_str());
    assert!(loaded.contains("\"level\":\"info\""), "{loaded}");
    assert_eq!(member_names(&format!("http://{address}")), ["from-file"]);
    assert!(data.join("member").is_dir(), "the file's data dir is used");
    assert!(!flag_data.join("member").exists(), "--data-dir is ignored");
    // the sample's enable-v2: true is accepted and noted, as with the flag
    assert!(m.log_text().contains("--enable-v2"), "{}", m.log_text());
}

#[test]
fn etcd_config_file_variable_names_the_file_and_other_variables_are_ignored() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let file = dir.path().join("etcd.conf.yml");
    std::fs::write(&file, sample("env-member", &data, "http")).unwrap();
    let (lines, _) = run_until(
        oxcd_bin().to_str().unwrap(),
        &[],
        &[
            ("ETCD_CONFIG_FILE", file.to_str().unwrap()),
            ("ETCD_NAME", "from-env"),
            ("ETCD_NOT_A_FLAG", "x"),
        ],
        "ready to serve client requests",
    );
    line_with(&lines, "ready to serve client requests");
    let loaded = line_with(&lines, LOADED);
    assert_eq!(json_field(loaded, "path").as_deref(), file.to_str());
    // no variable was read, nor warned about
    assert!(
        !lines
            .iter()
            .any(|l| l.contains("recognized and used environment variable")
                || l.contains("unrecognized environment variable")),
        "{}",
        lines.join("\n")
    );
    assert!(data.join("member").is_dir());
}

#[test]
fn tls_sections_give_a_tls_client_port() {
    let dir = tempfile::tempdir().unwrap();
    let mut ca = TestCa::new(dir.path(), "ca");
    let server = ca.issue("server", "oxcd", &["localhost", "127.0.0.1"], Usage::Server);
    let client = ca.issue("client", "root", &[], Usage::Client);
    let data = dir.path().join("data");
    let file = dir.path().join("etcd.conf.yml");
    let text = sample("tls-member", &data, "https").replace(
        "client-transport-security:\n  # Path to the client server TLS cert file.\n  cert-file:\n\n  # Path to the client server TLS key file.\n  key-file:\n\n  # Enable client cert authentication.\n  client-cert-auth: false\n\n  # Path to the client server TLS trusted CA cert file.\n  trusted-ca-file:\n",
        &format!(
            "client-transport-security:\n  cert-file: {}\n  key-file: {}\n  client-cert-auth: true\n  trusted-ca-file: {}\n",
            server.cert.display(),
            server.key.display(),
            ca.ca_file().display()
        ),
    );
    assert!(
        text.contains("client-cert-auth: true"),
        "the sample changed:\n{text}"
    );
    std::fs::write(&file, text).unwrap();
    let m = Process::launch_oxcd_args(
        &oxcd_bin(),
        &data,
        "",
        &["--config-file", file.to_str().unwrap()],
    );
    let address = m
        .wait_for_log("serving client traffic securely", START_DEADLINE)
        .and_then(|line| json_field(&line, "address"))
        .unwrap_or_else(|| panic!("no TLS client port; log:\n{}", m.log_text()));
    m.wait_for_log("ready to serve client requests", START_DEADLINE)
        .unwrap_or_else(|| panic!("not ready; log:\n{}", m.log_text()));
    let endpoint = format!("https://{address}");
    let etcdctl = |cert: bool| {
        let mut cmd = Command::new(testkit::ETCD_35.1);
        cmd.env("ETCDCTL_API", "3")
            .args([
                "--endpoints",
                &endpoint,
                "--dial-timeout",
                "3s",
                "--command-timeout",
                "4s",
            ])
            .args(["--cacert", ca.ca_file().to_str().unwrap()]);
        if cert {
            cmd.args([
                "--cert",
                client.cert.to_str().unwrap(),
                "--key",
                client.key.to_str().unwrap(),
            ]);
        }
        cmd.args(["put", "k", "v"])
            .output()
            .expect("etcdctl runs")
            .status
            .success()
    };
    if !Path::new(testkit::ETCD_35.1).exists() {
        eprintln!(
            "skipping the etcdctl half: {} not installed",
            testkit::ETCD_35.1
        );
        return;
    }
    assert!(etcdctl(true), "a client with a certificate is served");
    assert!(
        !etcdctl(false),
        "client-cert-auth: true refuses one without"
    );
}

/// The `error` field of a JSON log line.
fn error_field(line: &str) -> String {
    let value: serde_json::Value =
        serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
    value["error"].as_str().unwrap_or_default().to_string()
}

/// oxcd's and etcd 3.5.16's refusal of `text`: (error field, exit code).
fn refusal(bin: &str, text: &str) -> (String, Option<i32>) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("bad.yml");
    std::fs::write(&file, text).unwrap();
    let (lines, code) = run_until(
        bin,
        &["--config-file", file.to_str().unwrap()],
        &[],
        UNTIL_EXIT,
    );
    let line = line_with(&lines, "failed to verify flags");
    (error_field(line), code)
}

#[test]
fn a_malformed_file_is_refused_with_etcds_message() {
    let oxcd = oxcd_bin();
    let oxcd = oxcd.to_str().unwrap();
    let cases = [
        ("snapshot-count: abc\n", "error unmarshaling JSON: while decoding JSON: json: cannot unmarshal string into Go struct field configYAML.Config.snapshot-count of type uint64"),
        ("backend-batch-interval: 10ms\n", "error unmarshaling JSON: while decoding JSON: json: cannot unmarshal string into Go struct field configYAML.Config.backend-batch-interval of type time.Duration"),
        ("initial-cluster-state: bogus\n", "unexpected clusterState \"bogus\""),
        ("- a\n", "error unmarshaling JSON: while decoding JSON: json: cannot unmarshal array into Go value of type embed.configYAML"),
    ];
    let reference = Path::new(REFERENCE).exists();
    if !reference {
        eprintln!("not comparing with {REFERENCE}: not installed");
    }
    for (text, want) in cases {
        let (error, code) = refusal(oxcd, text);
        assert_eq!(error, want, "{text}");
        assert_eq!(code, Some(1), "{text}");
        if reference {
            assert_eq!(
                refusal(REFERENCE, text),
                (error, code),
                "etcd 3.5.16 on {text}"
            );
        }
    }
    // YAML syntax errors: etcd's words where our parser's problem is
    // libyaml's (elsewhere etcd's prefix and line, other words)
    for (text, want) in [
        (
            "name: x\nlist: [a, b\n",
            "error converting YAML to JSON: yaml: line 2: did not find expected ',' or ']'",
        ),
        (
            "a:\n  b: 1\n c: 2\n",
            "error converting YAML to JSON: yaml: line 2: did not find expected key",
        ),
    ] {
        let (error, code) = refusal(oxcd, text);
        assert_eq!(error, want, "{text}");
        assert_eq!(code, Some(1));
        if reference {
            assert_eq!(
                refusal(REFERENCE, text),
                (error, code),
                "etcd 3.5.16 on {text}"
            );
        }
    }
    let missing = "/nonexistent/etcd.conf.yml";
    let (lines, code) = run_until(oxcd, &["--config-file", missing], &[], UNTIL_EXIT);
    assert_eq!(
        error_field(line_with(&lines, "failed to verify flags")),
        "open /nonexistent/etcd.conf.yml: no such file or directory"
    );
    assert_eq!(code, Some(1));
}
