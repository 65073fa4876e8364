//! Log lines in the shape of etcd's zap JSON logger:
//! `{"level":"info","ts":"2026-01-02T03:04:05.678901Z","caller":"file.rs:12","msg":"...",...}`.
//! Operators and tools wait for etcd's messages ("ready to serve client
//! requests", "became leader at term N"): we log the same ones.
//!
//! Where they go is etcd's `--log-outputs` (`settings`: etcd's rules and
//! errors; `outputs`: every line to each): stderr, stdout, files, rotated
//! as lumberjack rotates them (`rotate`), or journald (`journal`).

use std::fmt;
use std::io::Write;
use std::path::Path;

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

mod journal;
mod outputs;
mod rotate;
mod settings;

pub use rotate::RotationConfig;
pub use settings::{LogSettings, SetupError, ERR_LOG_ROTATION_INVALID_LOG_OUTPUT};

pub(crate) struct EtcdJsonFormat;

/// Marks a field value that is already JSON (see [`strings`]): random
/// per process, so that no logged text (a client's key, a name) can pass
/// for it and forge fields into a line.
static RAW_JSON: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    use std::hash::{BuildHasher, Hasher};
    let nonce = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    format!("\u{0}json{nonce:016x}:")
});

/// A list of strings logged as a JSON array, as zap's `zap.Strings`
/// (`"args":["etcd","--name","m1"]`): `field = %logutil::strings(&list)`.
pub fn strings<S: AsRef<str>>(items: &[S]) -> RawJson {
    let quoted: Vec<String> = items.iter().map(|s| json_string(s.as_ref())).collect();
    RawJson(format!("[{}]", quoted.join(",")))
}

/// A field value written into the line as it is (made by [`strings`]).
pub struct RawJson(String);

impl fmt::Display for RawJson {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}", *RAW_JSON, self.0)
    }
}

struct JsonFields {
    msg: String,
    rest: String,
}

impl Visit for JsonFields {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.push(field, &format!("{value:?}"));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.push(field, value);
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.push_raw(field, &value.to_string());
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.push_raw(field, &value.to_string());
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.push_raw(field, &value.to_string());
    }
}

impl JsonFields {
    fn push(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.msg = value.to_string();
        } else if let Some(json) = value.strip_prefix(RAW_JSON.as_str()) {
            self.push_raw(field, json);
        } else {
            self.rest.push_str(&format!(
                ",{}:{}",
                json_string(field.name()),
                json_string(value)
            ));
        }
    }
    fn push_raw(&mut self, field: &Field, value: &str) {
        self.rest
            .push_str(&format!(",{}:{}", json_string(field.name()), value));
    }
}

pub(crate) fn json_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn level_name(level: &Level) -> &'static str {
    match *level {
        Level::ERROR => "error",
        Level::WARN => "warn",
        Level::INFO => "info",
        Level::DEBUG => "debug",
        Level::TRACE => "debug",
    }
}

impl<S, N> FormatEvent<S, N> for EtcdJsonFormat
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        _ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let meta = event.metadata();
        let mut fields = JsonFields {
            msg: String::new(),
            rest: String::new(),
        };
        event.record(&mut fields);
        let caller = caller(meta);
        // zap's "2006-01-02T15:04:05.000000Z0700" (oxcd: always UTC)
        let ts = humantime::format_rfc3339_micros(std::time::SystemTime::now());
        writeln!(
            writer,
            "{{\"level\":\"{}\",\"ts\":\"{}\",\"caller\":{},\"msg\":{}{}}}",
            level_name(meta.level()),
            ts,
            json_string(&caller),
            json_string(&fields.msg),
            fields.rest
        )
    }
}

/// zap's short caller: `etcdserver/server.rs:12`.
pub(crate) fn caller(meta: &tracing::Metadata<'_>) -> String {
    match (meta.file(), meta.line()) {
        (Some(file), Some(line)) => format!("{}:{}", short_path(file), line),
        _ => meta.target().to_string(),
    }
}

/// `crates/server/src/apply.rs` → `server/apply.rs`, as zap shortens callers
/// to the package and file.
fn short_path(file: &str) -> String {
    let file = file.strip_prefix("crates/").unwrap_or(file);
    file.replacen("/src/", "/", 1)
}

/// Installs the logger etcd's logging flags ask for, or says etcd's error.
pub fn setup(settings: &LogSettings) -> Result<(), SetupError> {
    let journal = Path::new(journal::JOURNAL_SOCKET);
    let (outputs, level) = settings::outputs_for(settings, journal)?;
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(level.to_string()))
        .with_writer(outputs::Outputs::new(outputs))
        .event_format(EtcdJsonFormat)
        .finish();
    tracing::subscriber::set_global_default(subscriber)
        .map_err(|e| SetupError::Invalid(e.to_string()))
}

/// etcd's default logger (stderr, info), for what is logged before the
/// flags are read or when they cannot be.
pub fn init_default() {
    let _ = tracing::subscriber::set_global_default(stderr_subscriber());
    let _ = std::io::stderr().flush();
}

/// Runs `f` with etcd's default logger (stderr, info) on this thread:
/// etcd logs what it finds while reading flags and variables there,
/// whatever `--log-outputs` says.
pub fn with_default_logger<R>(f: impl FnOnce() -> R) -> R {
    tracing::subscriber::with_default(stderr_subscriber(), f)
}

fn stderr_subscriber() -> impl tracing::Subscriber + Send + Sync {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new("info"))
        .with_writer(std::io::stderr)
        .event_format(EtcdJsonFormat)
        .finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_strings_are_escaped() {
        assert_eq!(json_string("a\"b\\c\nd\u{1}"), "\"a\\\"b\\\\c\\nd\\u0001\"");
    }

    /// The lines `f` logs through the etcd format.
    fn logged(f: impl FnOnce()) -> String {
        let buffer = std::sync::Arc::new(parking_lot::Mutex::new(Vec::new()));
        let sink = buffer.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || SharedBuffer(sink.clone()))
            .event_format(EtcdJsonFormat)
            .finish();
        tracing::subscriber::with_default(subscriber, f);
        let text = String::from_utf8(buffer.lock().clone()).unwrap();
        text
    }

    struct SharedBuffer(std::sync::Arc<parking_lot::Mutex<Vec<u8>>>);

    impl Write for SharedBuffer {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn only_this_process_marks_raw_json() {
        let line = logged(|| tracing::info!(key = "\u{0}json:{}", "x"));
        assert!(line.contains(r#""key":"\u0000json:{}""#), "{line}");
    }

    #[test]
    fn lines_have_zaps_fields_and_string_lists_are_json_arrays() {
        let line =
            logged(|| tracing::warn!(args = %strings(&["a\"b", "c"]), n = 3, s = "x", "hello"));
        let (head, tail) = line.split_once(",\"caller\":").unwrap();
        assert!(head.starts_with("{\"level\":\"warn\",\"ts\":\""), "{line}");
        // microseconds, UTC: 2026-01-02T03:04:05.678901Z
        let ts = &head["{\"level\":\"warn\",\"ts\":\"".len()..head.len() - 1];
        assert_eq!(ts.len(), 27, "{ts}");
        assert!(ts.ends_with('Z'));
        assert!(
            tail.ends_with(",\"msg\":\"hello\",\"args\":[\"a\\\"b\",\"c\"],\"n\":3,\"s\":\"x\"}\n"),
            "{line}"
        );
    }

    #[test]
    fn callers_keep_two_path_components() {
        assert_eq!(short_path("crates/server/src/apply.rs"), "server/apply.rs");
        assert_eq!(short_path("apply.rs"), "apply.rs");
    }
}
