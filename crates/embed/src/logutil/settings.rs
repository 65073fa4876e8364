//! etcd's logging flags to outputs, with etcd's rules and errors
//! (server/embed/config_logging.go `setupLogging`, `setupLogRotation`).

use std::fs::OpenOptions;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use parking_lot::Mutex;
use tracing::level_filters::LevelFilter;

use super::journal::JournalWriter;
use super::outputs::Output;
use super::rotate::{go_error, RotatingFile, RotationConfig};

const DEFAULT_OUTPUT: &str = "default";
const JOURNAL_OUTPUT: &str = "systemd/journal";
const STDERR_OUTPUT: &str = "stderr";
const STDOUT_OUTPUT: &str = "stdout";
/// etcd's ErrLogRotationInvalidLogOutput.
pub const ERR_LOG_ROTATION_INVALID_LOG_OUTPUT: &str =
    "--log-outputs requires a single file path when --log-rotate-config-json is defined";

/// etcd's logging flags.
#[derive(Debug, Clone)]
pub struct LogSettings {
    /// `--logger`
    pub logger: String,
    /// `--log-outputs`, as the flag or the config file gives them
    pub outputs: Vec<String>,
    /// `--log-level`
    pub level: String,
    /// `--enable-log-rotation`
    pub enable_rotation: bool,
    /// `--log-rotation-config-json`
    pub rotation_config_json: String,
}

/// Why logging cannot be set up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SetupError {
    /// etcd's error for the flags ("failed to verify flags", exit 1).
    Invalid(String),
    /// A `--log-level` zap does not know: etcd panics with this text
    /// (exit 2).
    UnknownLevel(String),
}

/// The outputs and level the settings ask for, or etcd's error.
pub(crate) fn outputs_for(
    settings: &LogSettings,
    journal_socket: &Path,
) -> Result<(Vec<Output>, LevelFilter), SetupError> {
    let invalid = SetupError::Invalid;
    match settings.logger.as_str() {
        "zap" => {}
        "capnslog" => return Err(invalid("--logger=capnslog is removed in v3.5".into())),
        other => return Err(invalid(format!("unknown logger option {other:?}"))),
    }
    let mut outputs = settings.outputs.clone();
    if outputs.is_empty() {
        outputs.push(DEFAULT_OUTPUT.into());
    }
    if outputs.len() > 1 && outputs.iter().any(|o| o == DEFAULT_OUTPUT) {
        return Err(invalid(format!(
            "multi logoutput for {DEFAULT_OUTPUT:?} is not supported yet"
        )));
    }
    let rotation = if settings.enable_rotation {
        Some(rotation_config(&outputs, &settings.rotation_config_json).map_err(invalid)?)
    } else {
        None
    };
    if outputs.iter().any(|o| o == JOURNAL_OUTPUT) {
        if outputs.len() > 1 {
            return Err(invalid(format!(
                "running with systemd/journal but other '--log-outputs' values ({}) are configured with 'default'; override 'default' value with something else",
                go_quoted_list(&outputs)
            )));
        }
        let journal = JournalWriter::connect(journal_socket).map_err(invalid)?;
        let level = level(&settings.level)?;
        return Ok((vec![Output::Journal(journal)], level));
    }
    let level = level(&settings.level)?;
    // zap's MergeOutputPaths: each path once; /dev/null alone discards all
    let mut paths: Vec<&str> = outputs
        .iter()
        .map(|o| match o.as_str() {
            DEFAULT_OUTPUT => STDERR_OUTPUT,
            other => other,
        })
        .collect();
    paths.sort_unstable();
    paths.dedup();
    if paths.contains(&"/dev/null") {
        paths = vec!["/dev/null"];
    }
    let mut opened = Vec::with_capacity(paths.len());
    for path in paths {
        opened.push(match (path, &rotation) {
            (STDERR_OUTPUT, _) => Output::Stderr,
            (STDOUT_OUTPUT, _) => Output::Stdout,
            // lumberjack opens its file at the first write
            (path, Some(config)) => Output::Rotating(Mutex::new(RotatingFile::new(
                PathBuf::from(path),
                config.clone(),
            ))),
            (path, None) => Output::File(Mutex::new(open_sink(path).map_err(invalid)?)),
        });
    }
    Ok((opened, level))
}

/// zap's file sink: appended to, created with mode 0666 (less the umask).
fn open_sink(path: &str) -> Result<std::fs::File, String> {
    OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o666)
        .open(path)
        .map_err(|e| format!("open sink {path:?}: open {path}: {}", go_error(&e)))
}

/// Go's `%q` of a []string: `["a" "b"]`.
fn go_quoted_list(items: &[String]) -> String {
    let quoted: Vec<String> = items.iter().map(|s| format!("{s:?}")).collect();
    format!("[{}]", quoted.join(" "))
}

/// zap's level names (zapcore.Level's UnmarshalText; "" is info). zap's
/// dpanic, panic and fatal levels log only those entries; oxcd logs
/// nothing above error, so they keep its errors.
pub(crate) fn level(text: &str) -> Result<LevelFilter, SetupError> {
    Ok(match text {
        "debug" | "DEBUG" => LevelFilter::DEBUG,
        "info" | "INFO" | "" => LevelFilter::INFO,
        "warn" | "WARN" => LevelFilter::WARN,
        "error" | "ERROR" | "dpanic" | "DPANIC" | "panic" | "PANIC" | "fatal" | "FATAL" => {
            LevelFilter::ERROR
        }
        other => {
            return Err(SetupError::UnknownLevel(format!(
                "unrecognized level: {other:?}"
            )))
        }
    })
}

/// etcd's setupLogRotation: exactly one file among the outputs (stdout,
/// stderr and default are not files; a lone journal is taken for one, as
/// etcd takes it), and the JSON read as Go's encoding/json reads it into
/// lumberjack's Logger.
fn rotation_config(outputs: &[String], json: &str) -> Result<RotationConfig, String> {
    let files = outputs
        .iter()
        .filter(|o| ![DEFAULT_OUTPUT, STDERR_OUTPUT, STDOUT_OUTPUT].contains(&o.as_str()))
        .count();
    if (outputs.len() == 1 && files == 0) || files > 1 {
        return Err(ERR_LOG_ROTATION_INVALID_LOG_OUTPUT.into());
    }
    if let Err(e) = serde_json::from_str::<serde_json::Value>(json) {
        return Err(format!(
            "improperly formatted log rotation config: {}",
            go_syntax_error(json, &e)
        ));
    }
    let mut config = RotationConfig::default();
    let value = json.trim_start();
    let kind = go_kind(value);
    if kind == "null" {
        // etcd dereferences a nil Logger here and crashes; oxcd takes
        // lumberjack's defaults
        return Ok(config);
    }
    if kind != "object" {
        return Err(format!(
            "invalid log rotation config: json: cannot unmarshal {kind} into Go value of type embed.logRotationConfig"
        ));
    }
    let mut first_error = None;
    for (key, raw) in members(value) {
        let field = [
            "filename",
            "maxsize",
            "maxage",
            "maxbackups",
            "localtime",
            "compress",
        ]
        .into_iter()
        .find(|name| name.eq_ignore_ascii_case(&key));
        let Some(field) = field else { continue };
        let set = match field {
            "filename" => go_string(raw).map(|_| ()),
            "maxsize" => go_int(raw).map(|v| config.max_size = v.unwrap_or(config.max_size)),
            "maxage" => go_int(raw).map(|v| config.max_age = v.unwrap_or(config.max_age)),
            "maxbackups" => {
                go_int(raw).map(|v| config.max_backups = v.unwrap_or(config.max_backups))
            }
            "localtime" => go_bool(raw).map(|v| config.local_time = v.unwrap_or(config.local_time)),
            _ => go_bool(raw).map(|v| config.compress = v.unwrap_or(config.compress)),
        };
        if let Err((value, go_type)) = set {
            first_error.get_or_insert(format!(
                "invalid log rotation config: json: cannot unmarshal {value} into Go struct field logRotationConfig.Logger.{field} of type {go_type}"
            ));
        }
    }
    match first_error {
        Some(e) => Err(e),
        None => Ok(config),
    }
}

/// What Go's UnmarshalTypeError calls a JSON value.
fn go_kind(raw: &str) -> &'static str {
    match raw.as_bytes().first() {
        Some(b'{') => "object",
        Some(b'[') => "array",
        Some(b'"') => "string",
        Some(b't') | Some(b'f') => "bool",
        Some(b'n') => "null",
        _ => "number",
    }
}

type TypeError = (String, &'static str);

/// An int field: null leaves it; a number must be an integer that fits.
fn go_int(raw: &str) -> Result<Option<i64>, TypeError> {
    match go_kind(raw) {
        "null" => Ok(None),
        "number" => raw
            .parse::<i64>()
            .map(Some)
            .map_err(|_| (format!("number {raw}"), "int")),
        kind => Err((kind.to_string(), "int")),
    }
}

fn go_bool(raw: &str) -> Result<Option<bool>, TypeError> {
    match raw {
        "null" => Ok(None),
        "true" => Ok(Some(true)),
        "false" => Ok(Some(false)),
        _ => Err((go_kind(raw).to_string(), "bool")),
    }
}

fn go_string(raw: &str) -> Result<Option<String>, TypeError> {
    match go_kind(raw) {
        "null" => Ok(None),
        "string" => Ok(serde_json::from_str(raw).ok()),
        kind => Err((kind.to_string(), "string")),
    }
}

/// The members of a JSON object already known to be valid, in order:
/// each key (unescaped) and its value's text.
fn members(object: &str) -> Vec<(String, &str)> {
    let bytes = object.as_bytes();
    let mut at = 1; // past '{'
    let mut out = Vec::new();
    loop {
        at = skip_space(bytes, at);
        if at >= bytes.len() || bytes[at] == b'}' {
            return out;
        }
        let key_end = value_end(bytes, at);
        let key = serde_json::from_str(&object[at..key_end]).unwrap_or_default();
        at = skip_space(bytes, key_end) + 1; // ':'
        at = skip_space(bytes, at);
        let end = value_end(bytes, at);
        out.push((key, &object[at..end]));
        at = skip_space(bytes, end);
        if bytes.get(at) == Some(&b',') {
            at += 1;
        }
    }
}

fn skip_space(bytes: &[u8], mut at: usize) -> usize {
    while at < bytes.len() && matches!(bytes[at], b' ' | b'\t' | b'\r' | b'\n') {
        at += 1;
    }
    at
}

/// Where the value starting at `at` ends (valid JSON assumed).
fn value_end(bytes: &[u8], start: usize) -> usize {
    let (mut depth, mut in_string, mut escaped) = (0usize, false, false);
    let mut at = start;
    while at < bytes.len() {
        let b = bytes[at];
        if in_string {
            match b {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => {
                    in_string = false;
                    if depth == 0 {
                        return at + 1;
                    }
                }
                _ => {}
            }
        } else {
            match b {
                b'"' => in_string = true,
                b'{' | b'[' => depth += 1,
                b'}' | b']' if depth == 0 => return at,
                b'}' | b']' => {
                    depth -= 1;
                    if depth == 0 {
                        return at + 1;
                    }
                }
                b',' | b' ' | b'\t' | b'\r' | b'\n' if depth == 0 => return at,
                _ => {}
            }
        }
        at += 1;
    }
    at
}

/// A syntax error in the words of Go's json.Unmarshal.
fn go_syntax_error(json: &str, e: &serde_json::Error) -> String {
    if e.classify() == serde_json::error::Category::Eof {
        return "unexpected end of JSON input".into();
    }
    if e.to_string().starts_with("trailing characters") {
        let offending = json
            .split('\n')
            .nth(e.line().saturating_sub(1))
            .and_then(|line| line.as_bytes().get(e.column().saturating_sub(1)))
            .map_or(' ', |b| char::from(*b));
        return format!("invalid character {offending:?} after top-level value");
    }
    etcdhttp::gateway::syntax_error(json.as_bytes(), e)
}

#[cfg(test)]
mod tests;
