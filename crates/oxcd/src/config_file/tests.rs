use super::*;

fn from_file(args: &[&str], env: &[(&str, &str)], text: &str) -> Result<Flags, String> {
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    let env: Vec<(String, String)> = env
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    match flags::parse(&args, &env).map_err(|e| e.message)? {
        flags::Parsed::Run(cmd) => {
            let path = cmd.config_file().expect("a config file").to_string();
            load(&cmd, &path, text)
        }
        other => panic!("{other:?}"),
    }
}

const SAMPLE: &str = include_str!("../../tests/fixtures/etcd.conf.yml.sample");

#[test]
fn etcds_sample_loads_with_its_values() {
    let flags = from_file(&["--config-file", "etcd.conf.yml"], &[], SAMPLE).unwrap();
    assert!(flags.loaded_from_file());
    assert_eq!(flags.uint("snapshot-count"), 10000);
    assert!(!flags.bool("strict-reconfig-check"));
    assert!(flags.bool("enable-v2") && flags.bool("enable-pprof"));
    assert_eq!(flags.str("log-level"), "debug");
    assert_eq!(flags.list("log-outputs"), ["stderr"]);
    assert_eq!(flags.str("auto-compaction-retention"), "1");
    assert_eq!(flags.str("proxy"), "off");
    // `initial-cluster:` is null: embed.NewConfig's default stays
    assert_eq!(
        flags.str("initial-cluster"),
        "default=http://localhost:2380"
    );
    assert_eq!(flags.list("listen-client-urls"), ["http://localhost:2379"]);
    let last = flags.notes.last().unwrap();
    assert_eq!(last.msg, LOADED);
    assert_eq!(last.fields, [("path", "etcd.conf.yml".to_string())]);
    let cfg = crate::config_from(&flags).unwrap();
    assert_eq!(cfg.server.snapshot_count, 10000);
    assert_eq!(
        cfg.server.data_dir,
        std::path::PathBuf::from("default.oxcd")
    );
}

#[test]
fn other_flags_and_variables_are_ignored() {
    let flags = from_file(
        &["--name", "from-flag", "--snapshot-count", "7"],
        &[
            ("ETCD_CONFIG_FILE", "/etc/etcd.yml"),
            ("ETCD_NAME", "from-env"),
            ("ETCD_WHATEVER", "x"),
        ],
        "name: from-file\n",
    )
    .unwrap();
    assert_eq!(flags.str("name"), "from-file");
    assert_eq!(flags.uint("snapshot-count"), 100000);
    assert_eq!(flags.config_file(), Some("/etc/etcd.yml"));
    // no variable was read or warned about
    assert_eq!(flags.notes.len(), 1, "{:?}", flags.notes);
}

#[test]
fn keys_take_etcds_types() {
    let flags = from_file(
        &["--config-file=f"],
        &[],
        "heartbeat-interval: 50\nelection-timeout: 500\nbackend-batch-interval: 10000000\n\
         experimental-snapshot-catch-up-entries: 42\nsocket-options:\n  reuse-port: true\n\
         Max-Txn-Ops: 3\nunknown-key: [1, 2]\nquota-backend-bytes: -1\n",
    )
    .unwrap();
    assert_eq!(flags.uint("heartbeat-interval"), 50);
    assert_eq!(flags.nanos("backend-batch-interval"), 10_000_000);
    assert_eq!(flags.uint("experimental-snapshot-catchup-entries"), 42);
    assert!(flags.bool("socket-reuse-port"));
    assert_eq!(flags.uint("max-txn-ops"), 3);
    assert_eq!(flags.int("quota-backend-bytes"), -1);
}

#[test]
fn tls_sections_set_both_sides() {
    let flags = from_file(
        &["--config-file=f"],
        &[],
        "client-transport-security:\n  cert-file: c.pem\n  key-file: c-key.pem\n  client-cert-auth: true\n  trusted-ca-file: ca.pem\n  allowed-cn: [admin]\n\
         peer-transport-security:\n  cert-file: p.pem\n  key-file: p-key.pem\n  auto-tls: true\n  allowed-hostname: [peer.example]\n",
    )
    .unwrap();
    assert_eq!(flags.str("cert-file"), "c.pem");
    assert!(flags.bool("client-cert-auth"));
    assert_eq!(flags.str("trusted-ca-file"), "ca.pem");
    assert_eq!(flags.client_allowed_cns, ["admin"]);
    assert_eq!(flags.str("peer-cert-file"), "p.pem");
    assert!(flags.bool("peer-auto-tls"));
    assert_eq!(flags.list("peer-cert-allowed-hostname"), ["peer.example"]);
    let cfg = crate::config_from(&flags).unwrap().server;
    assert_eq!(cfg.client_tls.allowed_cns, ["admin"]);
    assert!(cfg.client_tls.client_cert_auth);
}

#[test]
fn the_tracing_keys_turn_tracing_on() {
    let flags = from_file(
        &["--config-file=f"],
        &[],
        "experimental-enable-distributed-tracing: true\n\
         experimental-distributed-tracing-address: 127.0.0.1:4318\n\
         experimental-distributed-tracing-service-name: kv\n\
         experimental-distributed-tracing-instance-id: m1\n\
         experimental-distributed-tracing-sampling-rate: 500000\n",
    )
    .unwrap();
    let tracing = crate::config_from(&flags)
        .unwrap()
        .server
        .distributed_tracing;
    assert_eq!(
        tracing,
        Some(embed::DistributedTracing {
            address: "127.0.0.1:4318".into(),
            service_name: "kv".into(),
            service_instance_id: "m1".into(),
            sampling_rate_per_million: 500_000,
        })
    );
    let bad = from_file(
        &["--config-file=f"],
        &[],
        "experimental-enable-distributed-tracing: true\nexperimental-distributed-tracing-sampling-rate: -1\n",
    )
    .unwrap();
    assert_eq!(
        crate::config_from(&bad).unwrap_err(),
        "distributed tracing configurition is not valid: (tracing sampling rate must be positive)"
    );
}

/// Each error as etcd 3.5.16 prints it (checked with its binary).
#[test]
fn wrong_types_are_refused_with_gos_errors() {
    let cases = [
        ("snapshot-count: abc\n", "cannot unmarshal string into Go struct field configYAML.Config.snapshot-count of type uint64"),
        ("backend-batch-interval: 10ms\n", "cannot unmarshal string into Go struct field configYAML.Config.backend-batch-interval of type time.Duration"),
        ("snapshot-count: -1\n", "cannot unmarshal number -1 into Go struct field configYAML.Config.snapshot-count of type uint64"),
        ("snapshot-count: 1.5\n", "cannot unmarshal number 1.5 into Go struct field configYAML.Config.snapshot-count of type uint64"),
        ("snapshot-count: 99999999999999999999\n", "cannot unmarshal number 100000000000000000000 into Go struct field configYAML.Config.snapshot-count of type uint64"),
        ("log-outputs: stderr\n", "cannot unmarshal string into Go struct field configYAML.Config.log-outputs of type []string"),
        ("client-transport-security: 5\n", "cannot unmarshal number into Go struct field configYAML.configJSON.client-transport-security of type embed.securityConfig"),
        ("client-transport-security:\n  cert-file: [a]\n", "cannot unmarshal array into Go struct field securityConfig.configJSON.client-transport-security.cert-file of type string"),
        ("force-new-cluster: 'true'\nstrict-reconfig-check: yes\n", "cannot unmarshal string into Go struct field configYAML.Config.force-new-cluster of type bool"),
        // keys are decoded in sorted order: the first error is auto-compaction-retention's
        ("name: 123\nauto-compaction-retention: 1\n", "cannot unmarshal number into Go struct field configYAML.Config.auto-compaction-retention of type string"),
        ("- a\n- b\n", "cannot unmarshal array into Go value of type embed.configYAML"),
    ];
    for (text, want) in cases {
        let err = from_file(&["--config-file=f"], &[], text).unwrap_err();
        assert_eq!(
            err,
            format!("error unmarshaling JSON: while decoding JSON: json: {want}"),
            "{text}"
        );
    }
    // as etcd 3.5.16: the unquoted off is the string "false" there
    let err = from_file(&["--config-file=f"], &[], "proxy: off\n").unwrap_err();
    assert_eq!(err, "unexpected error setting up proxyFlag: invalid value");
    let err = from_file(&["--config-file=f"], &[], "initial-cluster-state: bogus\n").unwrap();
    assert_eq!(
        crate::config_from(&err).unwrap_err(),
        "unexpected clusterState \"bogus\""
    );
}
