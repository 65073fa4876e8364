use super::*;

fn settings(outputs: &[&str]) -> LogSettings {
    LogSettings {
        logger: "zap".into(),
        outputs: outputs.iter().map(|s| s.to_string()).collect(),
        level: "info".into(),
        enable_rotation: false,
        rotation_config_json: String::new(),
    }
}

fn rotating(outputs: &[&str], json: &str) -> LogSettings {
    LogSettings {
        enable_rotation: true,
        rotation_config_json: json.into(),
        ..settings(outputs)
    }
}

fn error(settings: &LogSettings) -> String {
    match outputs_for(settings, Path::new("/nonexistent/journal/socket")) {
        Ok(_) => panic!("{settings:?} accepted"),
        Err(SetupError::Invalid(e)) | Err(SetupError::UnknownLevel(e)) => e,
    }
}

/// etcd 3.5.16's answers (observed), each for the settings beside it.
#[test]
fn bad_settings_get_etcds_errors() {
    let cases = [
        (
            LogSettings {
                logger: "capnslog".into(),
                ..settings(&["default"])
            },
            "--logger=capnslog is removed in v3.5",
        ),
        (
            LogSettings {
                logger: "foo".into(),
                ..settings(&["default"])
            },
            "unknown logger option \"foo\"",
        ),
        (
            settings(&["default", "stderr"]),
            "multi logoutput for \"default\" is not supported yet",
        ),
        (
            settings(&["stderr", "systemd/journal"]),
            "running with systemd/journal but other '--log-outputs' values ([\"stderr\" \"systemd/journal\"]) are configured with 'default'; override 'default' value with something else",
        ),
        (
            settings(&["systemd/journal"]),
            "can't find journal (dial unixgram /nonexistent/journal/socket: connect: no such file or directory)",
        ),
        (
            settings(&["/nonexistent/dir/x.log"]),
            "open sink \"/nonexistent/dir/x.log\": open /nonexistent/dir/x.log: no such file or directory",
        ),
        (rotating(&["default"], "{}"), ERR_LOG_ROTATION_INVALID_LOG_OUTPUT),
        (rotating(&["stderr"], "{}"), ERR_LOG_ROTATION_INVALID_LOG_OUTPUT),
        (
            rotating(&["/tmp/a.log", "/tmp/b.log"], "{}"),
            ERR_LOG_ROTATION_INVALID_LOG_OUTPUT,
        ),
        (
            LogSettings {
                level: "bogus".into(),
                ..settings(&["stderr"])
            },
            "unrecognized level: \"bogus\"",
        ),
    ];
    for (settings, expected) in cases {
        assert_eq!(error(&settings), expected, "{settings:?}");
    }
}

#[test]
fn rotation_json_errors_are_gos() {
    let cases = [
        (
            "{x",
            "improperly formatted log rotation config: invalid character 'x' looking for beginning of object key string",
        ),
        (
            "{\"maxsize\":",
            "improperly formatted log rotation config: unexpected end of JSON input",
        ),
        (
            "",
            "improperly formatted log rotation config: unexpected end of JSON input",
        ),
        (
            "{} x",
            "improperly formatted log rotation config: invalid character 'x' after top-level value",
        ),
        (
            "{\"MaxSize\":\"x\"}",
            "invalid log rotation config: json: cannot unmarshal string into Go struct field logRotationConfig.Logger.maxsize of type int",
        ),
        (
            "{\"compress\":1}",
            "invalid log rotation config: json: cannot unmarshal number into Go struct field logRotationConfig.Logger.compress of type bool",
        ),
        (
            "{\"maxsize\":1.5}",
            "invalid log rotation config: json: cannot unmarshal number 1.5 into Go struct field logRotationConfig.Logger.maxsize of type int",
        ),
        (
            "{\"maxsize\":99999999999999999999}",
            "invalid log rotation config: json: cannot unmarshal number 99999999999999999999 into Go struct field logRotationConfig.Logger.maxsize of type int",
        ),
        (
            "{\"maxsize\":1e2}",
            "invalid log rotation config: json: cannot unmarshal number 1e2 into Go struct field logRotationConfig.Logger.maxsize of type int",
        ),
        (
            "[]",
            "invalid log rotation config: json: cannot unmarshal array into Go value of type embed.logRotationConfig",
        ),
        (
            "\"x\"",
            "invalid log rotation config: json: cannot unmarshal string into Go value of type embed.logRotationConfig",
        ),
        (
            "{\"filename\":1}",
            "invalid log rotation config: json: cannot unmarshal number into Go struct field logRotationConfig.Logger.filename of type string",
        ),
        (
            "{\"maxsize\":{\"a\":1}}",
            "invalid log rotation config: json: cannot unmarshal object into Go struct field logRotationConfig.Logger.maxsize of type int",
        ),
        (
            "{\"maxage\":\"1\",\"maxsize\":\"2\"}",
            "invalid log rotation config: json: cannot unmarshal string into Go struct field logRotationConfig.Logger.maxage of type int",
        ),
        (
            "{\"localtime\":\"true\"}",
            "invalid log rotation config: json: cannot unmarshal string into Go struct field logRotationConfig.Logger.localtime of type bool",
        ),
        (
            "{\"maxbackups\":true}",
            "invalid log rotation config: json: cannot unmarshal bool into Go struct field logRotationConfig.Logger.maxbackups of type int",
        ),
    ];
    for (json, expected) in cases {
        assert_eq!(
            rotation_config(&["/tmp/a.log".into()], json),
            Err(expected.into()),
            "{json}"
        );
    }
}

#[test]
fn rotation_json_is_read_as_go_reads_it_into_lumberjack() {
    let read = |json: &str| rotation_config(&["/tmp/a.log".into()], json).unwrap();
    assert_eq!(
        read(
            r#"{"maxsize": 100, "maxage": 0, "maxbackups": 0, "localtime": false, "compress": false}"#
        ),
        RotationConfig {
            max_size: 100,
            ..Default::default()
        }
    );
    assert_eq!(
        read(
            r#" {"MAXSIZE":5,"maxAge":3,"maxbackups":2,"localtime":true,"compress":true,"filename":"ignored","other":[1,{"x":"}"}],"maxsize":null} "#
        ),
        RotationConfig {
            max_size: 5,
            max_age: 3,
            max_backups: 2,
            local_time: true,
            compress: true,
        }
    );
    assert_eq!(read("null"), RotationConfig::default());
    assert_eq!(read(r#"{"maxsize":-1}"#).max_size, -1);
}

#[test]
fn rotation_takes_one_file_among_other_outputs_as_etcd() {
    for outputs in [
        &["stderr", "/tmp/a.log"][..],
        &["/tmp/a.log"],
        // etcd's check lets two non-file outputs through
        &["stderr", "stdout"],
    ] {
        let outputs: Vec<String> = outputs.iter().map(|s| s.to_string()).collect();
        assert!(rotation_config(&outputs, "{}").is_ok(), "{outputs:?}");
    }
}

#[test]
fn zaps_level_names_are_taken() {
    for (text, filter) in [
        ("debug", LevelFilter::DEBUG),
        ("DEBUG", LevelFilter::DEBUG),
        ("", LevelFilter::INFO),
        ("INFO", LevelFilter::INFO),
        ("warn", LevelFilter::WARN),
        ("error", LevelFilter::ERROR),
        ("panic", LevelFilter::ERROR),
        ("FATAL", LevelFilter::ERROR),
    ] {
        assert_eq!(level(text), Ok(filter), "{text}");
    }
    assert!(level("Debug").is_err());
}

#[test]
fn outputs_are_merged_as_zap_merges_them() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("a.log");
    let file = file.to_str().unwrap();
    let (outputs, _) = outputs_for(&settings(&[file, "stdout", file]), Path::new("/x")).unwrap();
    assert_eq!(outputs.len(), 2);
    let (outputs, _) =
        outputs_for(&settings(&[file, "/dev/null", "stderr"]), Path::new("/x")).unwrap();
    assert!(matches!(&outputs[..], [Output::File(_)]));
    let (outputs, _) = outputs_for(&settings(&[]), Path::new("/x")).unwrap();
    assert!(matches!(&outputs[..], [Output::Stderr]));
}
