use super::*;

fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

fn env(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn run(list: &[&str], vars: &[(&str, &str)]) -> Result<Flags, ParseError> {
    match parse(&args(list), &env(vars))? {
        Parsed::Run(flags) => Ok(*flags),
        other => panic!("{other:?}"),
    }
}

fn go_error(list: &[&str]) -> String {
    let e = run(list, &[]).unwrap_err();
    assert!(e.usage, "{e:?}");
    e.message
}

#[test]
fn every_default_parses_and_every_flag_has_its_env_name() {
    for spec in specs() {
        set_default(spec);
        assert!(env_name(spec.name).starts_with("ETCD_"));
    }
    assert_eq!(
        env_name("experimental-snapshot-catchup-entries"),
        "ETCD_EXPERIMENTAL_SNAPSHOT_CATCHUP_ENTRIES"
    );
}

#[test]
fn flags_are_read_as_gos_flag_package_reads_them() {
    let flags = run(
        &[
            "-name",
            "a",
            "--snapshot-count=5",
            "--enable-v2",
            "--pre-vote=false",
            "--heartbeat-interval",
            "0x10",
            "--backend-batch-interval",
            "-1s",
        ],
        &[],
    )
    .unwrap();
    assert_eq!(flags.str("name"), "a");
    assert_eq!(flags.uint("snapshot-count"), 5);
    assert!(flags.bool("enable-v2"));
    assert!(!flags.bool("pre-vote"));
    assert_eq!(flags.uint("heartbeat-interval"), 16);
    assert_eq!(flags.nanos("backend-batch-interval"), -1_000_000_000);
    assert_eq!(flags.source("name"), Source::CommandLine);
    assert_eq!(flags.source("data-dir"), Source::Default);
}

#[test]
fn bad_command_lines_get_gos_errors() {
    assert_eq!(
        go_error(&["--snapshot-count", "x"]),
        "invalid value \"x\" for flag -snapshot-count: parse error"
    );
    assert_eq!(
        go_error(&["--initial-cluster-state", "foo"]),
        "invalid value \"foo\" for flag -initial-cluster-state: invalid value"
    );
    assert_eq!(
        go_error(&["--listen-client-urls", "foo"]),
        "invalid value \"foo\" for flag -listen-client-urls: URL scheme must be http, https, unix, or unixs: foo"
    );
    assert_eq!(
        go_error(&["--listen-client-urls", "http://a"]),
        "invalid value \"http://a\" for flag -listen-client-urls: URL address does not have the form \"host:port\": http://a"
    );
    assert_eq!(
        go_error(&["--listen-client-urls", "http://a:1/p"]),
        "invalid value \"http://a:1/p\" for flag -listen-client-urls: URL must not contain a path: http://a:1/p"
    );
    assert_eq!(go_error(&["--foo"]), "flag provided but not defined: -foo");
    assert_eq!(
        go_error(&["--enable-v2=maybe"]),
        "invalid boolean value \"maybe\" for -enable-v2: parse error"
    );
    assert_eq!(go_error(&["--name"]), "flag needs an argument: -name");
    assert_eq!(
        go_error(&["--backend-batch-interval", "5"]),
        "invalid value \"5\" for flag -backend-batch-interval: parse error"
    );
    assert_eq!(
        go_error(&["--max-concurrent-streams", "4294967296"]),
        "invalid value \"4294967296\" for flag -max-concurrent-streams: strconv.ParseUint: parsing \"4294967296\": value out of range"
    );
    assert_eq!(
        go_error(&["--v2-deprecation", "soon"]),
        "invalid value \"soon\" for flag -v2-deprecation: invalid value \"soon\""
    );
    assert_eq!(go_error(&["---name"]), "bad flag syntax: ---name");
    assert_eq!(
        go_error(&["--name", "a", "--name", "b"]),
        "flag provided more than once: -name"
    );
    // a bool takes its value after '=' only, as Go: "true" is then an argument
    let e = run(&["--enable-v2", "true"], &[]).unwrap_err();
    assert_eq!(
        (e.usage, e.message.as_str()),
        (false, "'true' is not a valid flag")
    );
}

#[test]
fn help_and_version() {
    assert!(matches!(parse(&args(&["-h"]), &[]), Ok(Parsed::Help)));
    assert!(matches!(parse(&args(&["--help"]), &[]), Ok(Parsed::Help)));
    assert!(matches!(
        parse(&args(&["--version"]), &[]),
        Ok(Parsed::Version)
    ));
    assert!(matches!(
        parse(&args(&["--version=false"]), &[]),
        Ok(Parsed::Run(_))
    ));
}

#[test]
fn environment_variables_follow_etcds_rules() {
    let flags = run(
        &["--name", "cli"],
        &[
            ("ETCD_SNAPSHOT_COUNT", "7"),
            ("ETCD_NO_SUCH_THING", "1"),
            ("ETCD_DATA_DIR", ""),
            ("PATH", "/bin"),
            ("ETCD_VERSION", "3.5"),
        ],
    )
    .unwrap();
    assert_eq!(flags.uint("snapshot-count"), 7);
    assert_eq!(flags.source("snapshot-count"), Source::Environment);
    let summary: Vec<(Level, &str, String)> = flags
        .notes
        .iter()
        .map(|n| (n.level, n.msg, n.fields[0].1.clone()))
        .collect();
    assert_eq!(
        summary,
        vec![
            (
                Level::Warn,
                "cannot set special environment variable",
                "ETCD_VERSION".into()
            ),
            (
                Level::Info,
                "recognized and used environment variable",
                "ETCD_SNAPSHOT_COUNT".into()
            ),
            (
                Level::Warn,
                "unrecognized environment variable",
                "ETCD_NO_SUCH_THING=1".into()
            ),
            // etcd: an empty value is not used, so it is "unrecognized"
            (
                Level::Warn,
                "unrecognized environment variable",
                "ETCD_DATA_DIR=".into()
            ),
        ]
    );
}

#[test]
fn a_variable_shadowed_by_a_flag_is_fatal() {
    let flags = run(&["--name", "cli"], &[("ETCD_NAME", "env")]).unwrap();
    let last = flags.notes.last().unwrap();
    assert_eq!(last.level, Level::Fatal);
    assert_eq!(last.msg, "conflicting environment variable is shadowed by corresponding command-line flag (either unset environment variable or disable flag))");
    assert_eq!(
        last.fields,
        vec![("environment-variable", "ETCD_NAME".to_string())]
    );
    assert_eq!(flags.str("name"), "cli");
}

#[test]
fn a_bad_variable_is_refused_with_its_name() {
    let e = run(&[], &[("ETCD_SNAPSHOT_COUNT", "many")]).unwrap_err();
    assert!(!e.usage);
    assert_eq!(
        e.message,
        "invalid value \"many\" for ETCD_SNAPSHOT_COUNT: parse error"
    );
    let flags = run(&[], &[("ETCD_ENABLE_V2", "true")]).unwrap();
    assert!(flags.bool("enable-v2"));
}

#[test]
fn help_groups_flags_as_etcd_and_marks_no_effect_ones() {
    let text = help_text(specs());
    let member = text.find("\nMember:\n").unwrap();
    let clustering = text.find("\nClustering:\n").unwrap();
    let unsafe_ = text.find("\nUnsafe feature:\n").unwrap();
    assert!(member < clustering && clustering < unsafe_);
    assert!(text.contains(
        "  --enable-v2 'false'\n    Accept etcd V2 client requests. Deprecated and to be decommissioned in v3.6.\n    [no effect in oxcd: "
    ));
    assert!(text.contains("  --max-concurrent-streams 'math.MaxUint32'\n"));
    assert!(!text.contains("--cluster-active-size"));
}
