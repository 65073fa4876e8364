//! etcd's `--config-file` (and `ETCD_CONFIG_FILE`): a YAML file read as
//! etcd 3.5's `embed.ConfigFromFile` and etcdmain's `configFromFile` read
//! it. The file replaces every other flag and `ETCD_*` variable; values
//! start from etcd's defaults (`embed.NewConfig`); the keys are those of
//! etcd's `configJSON`/`Config` JSON tags (etcd.conf.yml.sample), typed as
//! Go's `encoding/json` decodes them after sigs.k8s.io/yaml has turned the
//! YAML into JSON: durations are integers of nanoseconds,
//! `heartbeat-interval`/`election-timeout` integers of milliseconds, URL
//! lists comma-separated strings, `log-outputs` and `cipher-suites` YAML
//! lists, the TLS settings in `client-transport-security` and
//! `peer-transport-security`. Unknown keys are ignored, as Go's decoder
//! ignores them; a value of the wrong type is refused with Go's error.
//!
//! The result is a [`Flags`] value, so that `config_from` runs the same
//! checks on a file as on flags.

mod yaml;

use std::collections::BTreeMap;

use crate::flags::{self, Flags, Level, Note, Value};
use yaml::Json;

/// How `encoding/json` decodes a value into a Go field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum GoType {
    Str,
    Uint64,
    Uint,
    Uint32,
    Int,
    Int64,
    Bool,
    Duration,
    Strings,
}

impl GoType {
    fn name(self) -> &'static str {
        match self {
            GoType::Str => "string",
            GoType::Uint64 => "uint64",
            GoType::Uint => "uint",
            GoType::Uint32 => "uint32",
            GoType::Int => "int",
            GoType::Int64 => "int64",
            GoType::Bool => "bool",
            GoType::Duration => "time.Duration",
            GoType::Strings => "[]string",
        }
    }
}

use GoType::*;

/// etcd's `embed.Config` keys: (key, the flag it sets, Go type).
const CONFIG_KEYS: &[(&str, &str, GoType)] = &[
    ("name", "name", Str),
    ("data-dir", "data-dir", Str),
    ("wal-dir", "wal-dir", Str),
    ("snapshot-count", "snapshot-count", Uint64),
    // the key is not the flag's name (--experimental-snapshot-catchup-entries)
    (
        "experimental-snapshot-catch-up-entries",
        "experimental-snapshot-catchup-entries",
        Uint64,
    ),
    ("max-snapshots", "max-snapshots", Uint),
    ("max-wals", "max-wals", Uint),
    ("heartbeat-interval", "heartbeat-interval", Uint),
    ("election-timeout", "election-timeout", Uint),
    (
        "initial-election-tick-advance",
        "initial-election-tick-advance",
        Bool,
    ),
    ("backend-batch-interval", "backend-batch-interval", Duration),
    ("backend-batch-limit", "backend-batch-limit", Int),
    (
        "backend-bbolt-freelist-type",
        "backend-bbolt-freelist-type",
        Str,
    ),
    ("quota-backend-bytes", "quota-backend-bytes", Int64),
    ("max-txn-ops", "max-txn-ops", Uint),
    ("max-request-bytes", "max-request-bytes", Uint),
    ("max-concurrent-streams", "max-concurrent-streams", Uint32),
    (
        "self-signed-cert-validity",
        "self-signed-cert-validity",
        Uint,
    ),
    ("cipher-suites", "cipher-suites", Strings),
    ("tls-min-version", "tls-min-version", Str),
    ("tls-max-version", "tls-max-version", Str),
    ("initial-cluster-state", "initial-cluster-state", Str),
    ("discovery-srv", "discovery-srv", Str),
    ("discovery-srv-name", "discovery-srv-name", Str),
    ("discovery-proxy", "discovery-proxy", Str),
    ("discovery", "discovery", Str),
    ("initial-cluster", "initial-cluster", Str),
    ("initial-cluster-token", "initial-cluster-token", Str),
    ("strict-reconfig-check", "strict-reconfig-check", Bool),
    ("enable-v2", "enable-v2", Bool),
    ("auto-compaction-mode", "auto-compaction-mode", Str),
    (
        "auto-compaction-retention",
        "auto-compaction-retention",
        Str,
    ),
    (
        "grpc-keepalive-min-time",
        "grpc-keepalive-min-time",
        Duration,
    ),
    (
        "grpc-keepalive-interval",
        "grpc-keepalive-interval",
        Duration,
    ),
    ("grpc-keepalive-timeout", "grpc-keepalive-timeout", Duration),
    ("pre-vote", "pre-vote", Bool),
    ("auth-token", "auth-token", Str),
    ("bcrypt-cost", "bcrypt-cost", Uint),
    ("auth-token-ttl", "auth-token-ttl", Uint),
    (
        "experimental-initial-corrupt-check",
        "experimental-initial-corrupt-check",
        Bool,
    ),
    (
        "experimental-corrupt-check-time",
        "experimental-corrupt-check-time",
        Duration,
    ),
    (
        "experimental-compact-hash-check-enabled",
        "experimental-compact-hash-check-enabled",
        Bool,
    ),
    (
        "experimental-compact-hash-check-time",
        "experimental-compact-hash-check-time",
        Duration,
    ),
    ("experimental-enable-v2v3", "experimental-enable-v2v3", Str),
    (
        "experimental-enable-lease-checkpoint",
        "experimental-enable-lease-checkpoint",
        Bool,
    ),
    (
        "experimental-enable-lease-checkpoint-persist",
        "experimental-enable-lease-checkpoint-persist",
        Bool,
    ),
    (
        "experimental-compaction-batch-limit",
        "experimental-compaction-batch-limit",
        Int,
    ),
    (
        "experimental-compaction-sleep-interval",
        "experimental-compaction-sleep-interval",
        Duration,
    ),
    (
        "experimental-watch-progress-notify-interval",
        "experimental-watch-progress-notify-interval",
        Duration,
    ),
    (
        "experimental-warning-apply-duration",
        "experimental-warning-apply-duration",
        Duration,
    ),
    (
        "experimental-bootstrap-defrag-threshold-megabytes",
        "experimental-bootstrap-defrag-threshold-megabytes",
        Uint,
    ),
    ("force-new-cluster", "force-new-cluster", Bool),
    ("enable-pprof", "enable-pprof", Bool),
    ("metrics", "metrics", Str),
    (
        "experimental-enable-distributed-tracing",
        "experimental-enable-distributed-tracing",
        Bool,
    ),
    (
        "experimental-distributed-tracing-address",
        "experimental-distributed-tracing-address",
        Str,
    ),
    (
        "experimental-distributed-tracing-service-name",
        "experimental-distributed-tracing-service-name",
        Str,
    ),
    (
        "experimental-distributed-tracing-instance-id",
        "experimental-distributed-tracing-instance-id",
        Str,
    ),
    (
        "experimental-distributed-tracing-sampling-rate",
        "experimental-distributed-tracing-sampling-rate",
        Int,
    ),
    ("logger", "logger", Str),
    ("log-level", "log-level", Str),
    ("log-outputs", "log-outputs", Strings),
    ("enable-log-rotation", "enable-log-rotation", Bool),
    ("log-rotation-config-json", "log-rotation-config-json", Str),
    ("enable-grpc-gateway", "enable-grpc-gateway", Bool),
    ("unsafe-no-fsync", "unsafe-no-fsync", Bool),
    (
        "experimental-downgrade-check-time",
        "experimental-downgrade-check-time",
        Duration,
    ),
    (
        "experimental-memory-mlock",
        "experimental-memory-mlock",
        Bool,
    ),
    (
        "experimental-txn-mode-write-with-shared-buffer",
        "experimental-txn-mode-write-with-shared-buffer",
        Bool,
    ),
    (
        "experimental-stop-grpc-service-on-defrag",
        "experimental-stop-grpc-service-on-defrag",
        Bool,
    ),
    ("v2-deprecation", "v2-deprecation", Str),
];

/// The string keys parsed as their flag once decoded, when not empty:
/// (key, the embedded struct that holds it).
const JSON_KEYS: &[(&str, &str)] = &[
    ("listen-peer-urls", "configJSON"),
    ("listen-client-urls", "configJSON"),
    ("listen-client-http-urls", "configJSON"),
    ("initial-advertise-peer-urls", "configJSON"),
    ("advertise-client-urls", "configJSON"),
    ("listen-metrics-urls", "Config"),
    ("cors", "configJSON"),
    ("host-whitelist", "configJSON"),
];

/// The two TLS sections and the flags their keys stand for, in the order
/// of `securityConfig`'s keys below.
const CLIENT_SECURITY: &str = "client-transport-security";
const PEER_SECURITY: &str = "peer-transport-security";
/// `securityConfig`: (key, client flag, peer flag, Go type); the client
/// side's `allowed-cn` has no flag.
const SECURITY_KEYS: &[(&str, &str, &str, GoType)] = &[
    ("cert-file", "cert-file", "peer-cert-file", Str),
    ("key-file", "key-file", "peer-key-file", Str),
    (
        "client-cert-file",
        "client-cert-file",
        "peer-client-cert-file",
        Str,
    ),
    (
        "client-key-file",
        "client-key-file",
        "peer-client-key-file",
        Str,
    ),
    (
        "client-cert-auth",
        "client-cert-auth",
        "peer-client-cert-auth",
        Bool,
    ),
    (
        "trusted-ca-file",
        "trusted-ca-file",
        "peer-trusted-ca-file",
        Str,
    ),
    ("auto-tls", "auto-tls", "peer-auto-tls", Bool),
    ("allowed-cn", "", "peer-cert-allowed-cn", Strings),
    (
        "allowed-hostname",
        "client-cert-allowed-hostname",
        "peer-cert-allowed-hostname",
        Strings,
    ),
];

/// `transport.SocketOpts` under `socket-options`.
const SOCKET_KEYS: &[(&str, &str)] = &[
    ("reuse-port", "socket-reuse-port"),
    ("reuse-address", "socket-reuse-address"),
];

/// etcdmain's `configProxy`, read from the same file in a second pass.
const PROXY_KEYS: &[(&str, GoType)] = &[
    ("proxy-failure-wait", Uint),
    ("proxy-refresh-interval", Uint),
    ("proxy-dial-timeout", Uint),
    ("proxy-write-timeout", Uint),
    ("proxy-read-timeout", Uint),
    ("proxy", Str),
    ("discovery-fallback", Str),
];

/// The message etcd logs once the file is read.
pub const LOADED: &str = "loaded server configuration, other configuration command line flags and environment variables will be ignored if provided";

/// The flags the config file at `path` (read into `text`) sets; `command_line`
/// is what etcd's command line held (its notes are kept, its values not).
pub fn load(command_line: &Flags, path: &str, text: &str) -> Result<Flags, String> {
    let mut flags = Flags::for_file(path, command_line.notes.clone());
    let json = yaml::to_json(text)?;
    let object = match json {
        Json::Null => BTreeMap::new(),
        Json::Object(object) => object,
        other => {
            return Err(unmarshal_error(format!(
                "cannot unmarshal {} into Go value of type embed.configYAML",
                other.kind()
            )))
        }
    };
    let mut strings: BTreeMap<&str, String> = BTreeMap::new();
    // Go's decoder: keys in the JSON's (sorted) order, the first error wins
    for (key, value) in &object {
        if let Some(&(field, flag, ty)) = lookup(CONFIG_KEYS, key, |k| k.0) {
            let path = format!("configYAML.Config.{field}");
            if let Some(v) = decode(value, ty, &path)? {
                flags.set_from_file(flag, flag_value(flag, v));
            }
        } else if let Some(&(field, holder)) = lookup(JSON_KEYS, key, |k| k.0) {
            let path = format!("configYAML.{holder}.{field}");
            if let Some(Value::Str(s)) = decode(value, Str, &path)? {
                strings.insert(field, s);
            }
        } else if let Some(&side) = lookup(&[CLIENT_SECURITY, PEER_SECURITY], key, |k| k) {
            security(&mut flags, side, value)?;
        } else if let Some(&field) = lookup(&["socket-options"], key, |k| k) {
            let Some(entries) = object_of(
                value,
                &format!("configYAML.Config.{field}"),
                "transport.SocketOpts",
            )?
            else {
                continue;
            };
            for (key, value) in entries {
                if let Some(&(field_name, flag)) = lookup(SOCKET_KEYS, key, |k| k.0) {
                    let path = format!("SocketOpts.Config.socket-options.{field_name}");
                    if let Some(v) = decode(value, Bool, &path)? {
                        flags.set_from_file(flag, v);
                    }
                }
            }
        }
    }
    for (key, value) in &object {
        if let Some(&(field, ty)) = lookup(PROXY_KEYS, key, |k| k.0) {
            let path = format!("configProxy.{field}");
            // configProxy's fields are its own (not an embedded struct's):
            // sigs.k8s.io/yaml turns a scalar meant for a string field into
            // a string (`proxy: off` is "false", which the flag refuses)
            let value = &match (ty, value) {
                (Str, Json::Bool(b)) => Json::Str(b.to_string()),
                (Str, Json::Number(n)) => Json::Str(n.clone()),
                (_, other) => other.clone(),
            };
            if let Some(v) = decode(value, ty, &path)? {
                if ty == Str {
                    let text = match &v {
                        Value::Str(s) => s.clone(),
                        _ => unreachable!("a string field decodes to a string"),
                    };
                    if text.is_empty() {
                        continue;
                    }
                    let spec = flags::spec(field).expect("a proxy flag");
                    let v = flags::set_text(spec, &text).map_err(|e| {
                        let what = if field == "proxy" {
                            "proxyFlag".to_string()
                        } else {
                            format!("{field} flag")
                        };
                        format!("unexpected error setting up {what}: {e}")
                    })?;
                    flags.set_from_file(field, v);
                } else {
                    flags.set_from_file(field, v);
                }
            }
        }
    }
    // embed's configFromFile: the URL strings, then its fix-ups
    for (field, _) in JSON_KEYS {
        let Some(text) = strings.get(field).filter(|s| !s.is_empty()) else {
            continue;
        };
        let spec = flags::spec(field).expect("a URL flag");
        let value = flags::set_text(spec, text).map_err(|e| {
            // etcd's message names advertise-client-urls so
            let name = if *field == "advertise-client-urls" {
                "advertise-peer-urls"
            } else {
                field
            };
            format!("unexpected error setting up {name}: {e}")
        })?;
        flags.set_from_file(field, value);
    }
    let default_cluster = flags::spec("initial-cluster").expect("a flag").default;
    if (!flags.str("discovery").is_empty() || !flags.str("discovery-srv").is_empty())
        && flags.str("initial-cluster") == default_cluster
    {
        flags.set_from_file("initial-cluster", Value::Str(String::new()));
    }
    if flags.str("initial-cluster-state").is_empty() {
        flags.set_from_file("initial-cluster-state", Value::Str("new".into()));
    }
    if flags.uint("self-signed-cert-validity") == 0 {
        flags.set_from_file("self-signed-cert-validity", Value::Uint(1));
    }
    flags.notes.push(Note {
        level: Level::Info,
        msg: LOADED,
        fields: vec![("path", path.to_string())],
    });
    Ok(flags)
}

/// A value as the flag's kind stores it (`v2-deprecation` is a one-item
/// list, as its flag makes it).
fn flag_value(flag: &str, value: Value) -> Value {
    match (flag, value) {
        ("v2-deprecation", Value::Str(s)) => Value::List(vec![s]),
        (_, v) => v,
    }
}

/// One TLS section.
fn security(flags: &mut Flags, side: &str, value: &Json) -> Result<(), String> {
    let Some(entries) = object_of(
        value,
        &format!("configYAML.configJSON.{side}"),
        "embed.securityConfig",
    )?
    else {
        return Ok(());
    };
    for (key, value) in entries {
        let Some(&(field, client_flag, peer_flag, ty)) = lookup(SECURITY_KEYS, key, |k| k.0) else {
            continue;
        };
        let path = format!("securityConfig.configJSON.{side}.{field}");
        let Some(v) = decode(value, ty, &path)? else {
            continue;
        };
        let flag = if side == CLIENT_SECURITY {
            client_flag
        } else {
            peer_flag
        };
        match (flag, v) {
            ("", Value::List(cns)) => flags.client_allowed_cns = cns,
            (flag, v) => flags.set_from_file(flag, v),
        }
    }
    Ok(())
}

/// An object field's entries; None for null (Go leaves the struct as is).
fn object_of<'a>(
    value: &'a Json,
    path: &str,
    go_type: &str,
) -> Result<Option<&'a BTreeMap<String, Json>>, String> {
    match value {
        Json::Null => Ok(None),
        Json::Object(entries) => Ok(Some(entries)),
        other => Err(type_error(other.kind(), path, go_type)),
    }
}

/// Go's `encoding/json` field match: the exact key, else one equal but
/// for ASCII case.
fn lookup<'a, T>(table: &'a [T], key: &str, name: impl Fn(&T) -> &str) -> Option<&'a T> {
    table
        .iter()
        .find(|t| name(t) == key)
        .or_else(|| table.iter().find(|t| name(t).eq_ignore_ascii_case(key)))
}

fn unmarshal_error(message: String) -> String {
    format!("error unmarshaling JSON: while decoding JSON: json: {message}")
}

fn type_error(what: &str, path: &str, go_type: &str) -> String {
    unmarshal_error(format!(
        "cannot unmarshal {what} into Go struct field {path} of type {go_type}"
    ))
}

/// `value` decoded into a Go field of type `ty`; None when it is null and
/// Go leaves the field as it is.
fn decode(value: &Json, ty: GoType, path: &str) -> Result<Option<Value>, String> {
    let mismatch = |what: &str| Err(type_error(what, path, ty.name()));
    match (ty, value) {
        (Strings, Json::Null) => Ok(Some(Value::List(Vec::new()))),
        (_, Json::Null) => Ok(None),
        (Str, Json::Str(s)) => Ok(Some(Value::Str(s.clone()))),
        (Bool, Json::Bool(b)) => Ok(Some(Value::Bool(*b))),
        (Uint64 | Uint | Uint32, Json::Number(n)) => {
            let max = if ty == Uint32 {
                u64::from(u32::MAX)
            } else {
                u64::MAX
            };
            match n.parse::<u64>() {
                Ok(v) if v <= max && n.bytes().all(|b| b.is_ascii_digit()) => {
                    Ok(Some(Value::Uint(v)))
                }
                _ => mismatch(&format!("number {n}")),
            }
        }
        (Int | Int64 | Duration, Json::Number(n)) => match n.parse::<i64>() {
            Ok(v) if !n.starts_with('+') => Ok(Some(if ty == Duration {
                Value::Nanos(v)
            } else {
                Value::Int(v)
            })),
            _ => mismatch(&format!("number {n}")),
        },
        (Strings, Json::Array(items)) => {
            let mut list = Vec::new();
            for item in items {
                match item {
                    Json::Str(s) => list.push(s.clone()),
                    Json::Null => list.push(String::new()),
                    other => return Err(type_error(other.kind(), path, "string")),
                }
            }
            Ok(Some(Value::List(list)))
        }
        (_, other) => mismatch(other.kind()),
    }
}

#[cfg(test)]
mod tests;
