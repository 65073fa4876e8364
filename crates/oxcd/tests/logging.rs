//! etcd's logging flags (`--log-outputs`, `--enable-log-rotation`,
//! `--log-rotation-config-json`, `--logger`, `--log-level`), the slow
//! request warning (`--experimental-warning-apply-duration`) and the
//! initial election tick advance, as etcd 3.5.16 logs them.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use testkit::logged::{clean_command, run_until, UNTIL_EXIT};
use testkit::{json_field, oxcd_bin, Cluster, START_DEADLINE};

const ETCD_3516: &str = "/opt/etcd-3.5.16/etcd";

/// A member on loopback port 0 with `extra` flags, stdout and stderr piped.
fn member_command(bin: &Path, data_dir: &Path, extra: &[&str]) -> Command {
    let mut cmd = clean_command(bin);
    cmd.arg("--data-dir")
        .arg(data_dir)
        .args(["--listen-client-urls", "http://127.0.0.1:0"])
        .args(["--advertise-client-urls", "http://127.0.0.1:0"])
        .args(["--listen-peer-urls", "http://127.0.0.1:0"])
        .args(["--initial-advertise-peer-urls", "http://127.0.0.1:0"])
        .args(extra)
        .stdout(Stdio::piped());
    cmd
}

/// The lines one of a child's pipes gives, as they come.
fn lines_of(pipe: impl std::io::Read + Send + 'static) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(pipe).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

/// Reads `rx` into `seen` until a line contains `needle` (that line) or
/// the deadline passes.
fn read_until(rx: &mpsc::Receiver<String>, seen: &mut Vec<String>, needle: &str) -> Option<String> {
    if let Some(line) = seen.iter().find(|l| l.contains(needle)) {
        return Some(line.clone());
    }
    let deadline = Instant::now() + START_DEADLINE;
    while let Ok(line) = rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
        seen.push(line.clone());
        if line.contains(needle) {
            return Some(line);
        }
    }
    None
}

/// The file's lines once one contains `needle`, polled until the deadline.
fn file_lines_once(path: &Path, needle: &str) -> Vec<String> {
    let deadline = Instant::now() + START_DEADLINE;
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        if text.contains(needle) {
            return text.lines().map(str::to_string).collect();
        }
        assert!(
            Instant::now() < deadline,
            "{} never logged {needle:?}:\n{text}",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Kills the child when the test ends, however it ends.
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn terminate(child: &mut Child) -> Option<i32> {
    let sent = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill runs");
    assert!(sent.success());
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return status.code();
        }
        assert!(Instant::now() < deadline, "the member did not stop");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `--log-outputs stdout,<file>` writes every line to both and none to
/// stderr; with `--experimental-warning-apply-duration 1ns` a put is logged
/// as etcd logs a slow apply and counted; a lone member fast-forwards its
/// election ticks with etcd's line.
#[test]
fn log_outputs_get_every_line_and_a_slow_apply_is_warned_about() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("logs").join("oxcd.log");
    std::fs::create_dir_all(file.parent().unwrap()).unwrap();
    let outputs = format!("stdout,{}", file.display());
    let mut child = Reaped(
        member_command(
            &oxcd_bin(),
            &dir.path().join("data"),
            &[
                "--log-outputs",
                &outputs,
                "--experimental-warning-apply-duration",
                "1ns",
            ],
        )
        .spawn()
        .unwrap(),
    );
    let stdout = lines_of(child.0.stdout.take().unwrap());
    let stderr = lines_of(child.0.stderr.take().unwrap());
    let mut out = Vec::new();
    let serving = read_until(&stdout, &mut out, "serving client traffic")
        .unwrap_or_else(|| panic!("no client listener; stdout:\n{}", out.join("\n")));
    let endpoint = format!("http://{}", json_field(&serving, "address").unwrap());
    read_until(&stdout, &mut out, "ready to serve client requests").expect("ready");

    let put = testkit::http::post(&endpoint, "/v3/kv/put", r#"{"key":"Zm9v","value":"YmFy"}"#)
        .expect("put answers");
    assert_eq!(put.status, 200, "{}", put.body);
    // etcd: {"msg":"apply request took too long","took":"...","expected-duration":"1ns",
    // "prefix":"","request":"header:<ID:... > put:<key:\"foo\" value_size:3 >","response":"size:4"}
    let slow = read_until(&stdout, &mut out, r#"put:<key:\"foo\" value_size:3 >"#)
        .unwrap_or_else(|| panic!("no slow apply warning:\n{}", out.join("\n")));
    assert!(
        slow.contains(r#""msg":"apply request took too long""#),
        "{slow}"
    );
    assert!(
        slow.contains(r#""expected-duration":"1ns","prefix":"","request":"header:<ID:"#),
        "{slow}"
    );
    assert!(slow.contains(r#""response":"size:"#), "{slow}");
    let range = testkit::http::post(
        &endpoint,
        "/v3/kv/range",
        r#"{"key":"Zm9v","serializable":true}"#,
    )
    .expect("range answers");
    assert_eq!(range.status, 200, "{}", range.body);
    let slow_read = read_until(&stdout, &mut out, r#""prefix":"read-only range ""#)
        .unwrap_or_else(|| panic!("no slow read warning:\n{}", out.join("\n")));
    assert!(
        slow_read.contains(
            r#""request":"key:\"foo\" serializable:true ","response":"range_response_count:1 size:"#
        ),
        "{slow_read}"
    );
    let metrics = testkit::http::get(&endpoint, "/metrics").expect("metrics");
    let slow_total = metrics
        .body
        .lines()
        .find_map(|l| l.strip_prefix("etcd_server_slow_apply_total "))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .expect("etcd_server_slow_apply_total");
    assert!(slow_total >= 2.0, "{slow_total}");

    assert_eq!(terminate(&mut child.0), Some(0));
    // the process is gone: its pipe ends
    out.extend(stdout.iter());
    let mut in_file = file_lines_once(&file, "closed etcd server");
    // every line goes to each output (threads logging at once may
    // interleave differently in each, as with zap's)
    let mut sorted_out = out.clone();
    sorted_out.sort();
    in_file.sort();
    assert_eq!(in_file, sorted_out, "stdout and the file differ");
    for needle in [
        r#""msg":"Running: ","args":["#,
        "starting an etcd server",
        "started as single-node; fast-forwarding election ticks\",\"local-member-id\":",
        "\"forward-ticks\":9,\"forward-duration\":\"900ms\",\"election-ticks\":10,\"election-timeout\":\"1s\"",
        "ready to serve client requests",
        "received signal; shutting down",
        "skipped leadership transfer for single voting member cluster",
    ] {
        assert!(out.iter().any(|l| l.contains(needle)), "{needle}:\n{}", out.join("\n"));
    }
    // what reading the flags found goes to etcd's default logger only
    let errors: Vec<String> = stderr.try_iter().collect();
    assert!(
        !errors.iter().any(|l| l.contains("Running: ")),
        "{errors:?}"
    );
}

/// The error a member gives for `flags` and its exit status.
fn refusal(bin: &str, flags: &[&str]) -> (Option<String>, Option<i32>) {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = clean_command(bin);
    cmd.arg("--data-dir").arg(dir.path()).args(flags);
    let (lines, code) = run_until(cmd, UNTIL_EXIT, START_DEADLINE);
    let error = lines
        .iter()
        .find(|l| l.contains("failed to verify flags"))
        .and_then(|l| {
            l.split_once(r#""error":"#)
                .map(|(_, e)| e.trim_end_matches('}').to_string())
        });
    (error, code)
}

/// The logging flags' errors are etcd 3.5.16's (checked against it when
/// it is installed), logged as "failed to verify flags" with exit status 1;
/// rotation writes its one file.
#[test]
fn logging_flag_errors_are_etcds_and_rotation_writes_its_file() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing").join("x.log");
    let missing = missing.to_str().unwrap();
    let one_file = dir.path().join("r.log");
    let one_file = one_file.to_str().unwrap();
    let cases: Vec<(Vec<&str>, String)> = vec![
        (
            vec!["--logger", "capnslog"],
            r#""--logger=capnslog is removed in v3.5""#.into(),
        ),
        (vec!["--logger", "foo"], r#""unknown logger option \"foo\"""#.into()),
        (
            vec!["--log-outputs", "default,stderr"],
            r#""multi logoutput for \"default\" is not supported yet""#.into(),
        ),
        (
            vec!["--log-outputs", "systemd/journal,stderr"],
            r#""running with systemd/journal but other '--log-outputs' values ([\"stderr\" \"systemd/journal\"]) are configured with 'default'; override 'default' value with something else""#.into(),
        ),
        (
            vec!["--enable-log-rotation"],
            r#""--log-outputs requires a single file path when --log-rotate-config-json is defined""#.into(),
        ),
        (
            vec!["--enable-log-rotation", "--log-outputs", "stderr"],
            r#""--log-outputs requires a single file path when --log-rotate-config-json is defined""#.into(),
        ),
        (
            vec!["--enable-log-rotation", "--log-outputs", one_file, "--log-rotation-config-json", "{x"],
            r#""improperly formatted log rotation config: invalid character 'x' looking for beginning of object key string""#.into(),
        ),
        (
            vec!["--enable-log-rotation", "--log-outputs", one_file, "--log-rotation-config-json", r#"{"maxsize":"x"}"#],
            r#""invalid log rotation config: json: cannot unmarshal string into Go struct field logRotationConfig.Logger.maxsize of type int""#.into(),
        ),
        (
            vec!["--log-outputs", missing],
            format!(r#""open sink \"{missing}\": open {missing}: no such file or directory""#),
        ),
    ];
    let etcd = Path::new(ETCD_3516).exists();
    for (flags, expected) in &cases {
        let (error, code) = refusal(oxcd_bin().to_str().unwrap(), flags);
        assert_eq!(error.as_deref(), Some(expected.as_str()), "{flags:?}");
        assert_eq!(code, Some(1), "{flags:?}");
        if etcd {
            let (error, code) = refusal(ETCD_3516, flags);
            assert_eq!(error.as_deref(), Some(expected.as_str()), "etcd, {flags:?}");
            assert_eq!(code, Some(1), "etcd, {flags:?}");
        }
    }
    // zap refuses a level it does not know (etcd panics: exit status 2)
    let (lines, code) = {
        let mut cmd = clean_command(oxcd_bin());
        cmd.arg("--data-dir")
            .arg(dir.path().join("d"))
            .args(["--log-level", "loud"]);
        run_until(cmd, UNTIL_EXIT, START_DEADLINE)
    };
    assert_eq!(code, Some(2));
    assert!(
        lines
            .iter()
            .any(|l| l.contains(r#"unrecognized level: "loud""#)),
        "{lines:?}"
    );

    // one file, rotated as lumberjack rotates it: the member logs there
    let rotated = dir.path().join("rotated").join("etcd.log");
    let outputs = rotated.to_str().unwrap().to_string();
    let mut child = Reaped(
        member_command(
            &oxcd_bin(),
            &dir.path().join("data"),
            &[
                "--enable-log-rotation",
                "--log-outputs",
                &outputs,
                "--log-rotation-config-json",
                r#"{"maxsize": 1, "maxage": 0, "maxbackups": 2, "localtime": false, "compress": true}"#,
                "--log-level",
                "DEBUG",
            ],
        )
        .spawn()
        .unwrap(),
    );
    // lumberjack makes the missing directory itself
    let lines = file_lines_once(&rotated, "ready to serve client requests");
    assert!(
        lines.iter().any(|l| l.contains(r#""level":"debug""#)),
        "DEBUG is zap's debug"
    );
    assert_eq!(terminate(&mut child.0), Some(0));
}

/// Members of a cluster wait for their peers' links and then fast-forward
/// their election ticks, as etcd's adjustTicks; with
/// `--initial-election-tick-advance=false` a member does not.
#[test]
fn cluster_members_advance_election_ticks_once_their_peers_are_connected() {
    let mut cluster = Cluster::prepare(3, &[]);
    cluster.spawn_with(2, &["--initial-election-tick-advance=false"]);
    cluster.start_all();
    let member = |i: usize| cluster.members[i].as_ref().unwrap();
    for i in 0..2 {
        assert!(
            member(i)
                .wait_for_log(
                    r#""msg":"starting initial election tick advance","election-ticks":10"#,
                    START_DEADLINE
                )
                .is_some(),
            "{}",
            member(i).log_text()
        );
    }
    // once both its peers' links are up; they are, the cluster being ready
    let advanced = member(0)
        .wait_for_log(
            "initialized peer connections; fast-forwarding election ticks",
            START_DEADLINE,
        )
        .unwrap_or_else(|| panic!("{}", member(0).log_text()));
    for field in [
        r#""forward-ticks":8"#,
        r#""forward-duration":"800ms""#,
        r#""election-timeout":"1s""#,
        r#""active-remote-members":2"#,
    ] {
        assert!(advanced.contains(field), "{advanced}");
    }
    assert!(
        member(2)
            .wait_for_log(
                r#""msg":"skipping initial election tick advance","election-ticks":10"#,
                START_DEADLINE
            )
            .is_some(),
        "{}",
        member(2).log_text()
    );
    assert!(!member(2)
        .log_text()
        .contains("fast-forwarding election ticks"));
}
