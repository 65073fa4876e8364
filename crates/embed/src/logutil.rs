//! Log lines in the shape of etcd's zap JSON logger:
//! `{"level":"info","ts":"2026-01-02T03:04:05.678Z","caller":"file.rs:12","msg":"...",...}`.
//! Operators and tools wait for etcd's messages ("ready to serve client
//! requests", "became leader at term N"): we log the same ones.

use std::fmt;
use std::io::Write;

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

pub(crate) struct EtcdJsonFormat;

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
        let caller = match (meta.file(), meta.line()) {
            (Some(file), Some(line)) => format!("{}:{}", short_path(file), line),
            _ => meta.target().to_string(),
        };
        let ts = humantime::format_rfc3339_millis(std::time::SystemTime::now());
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

/// `crates/server/src/apply.rs` → `server/apply.rs`, as zap shortens callers
/// to the package and file.
fn short_path(file: &str) -> String {
    let file = file.strip_prefix("crates/").unwrap_or(file);
    file.replacen("/src/", "/", 1)
}

/// Installs the etcd-shaped JSON logger on stderr at `level` (etcd's
/// --log-level: debug, info, warn, error, panic, fatal).
pub fn init(level: &str) -> Result<(), String> {
    let filter = match level {
        "debug" => "debug",
        "info" => "info",
        "warn" => "warn",
        "error" | "dpanic" | "panic" | "fatal" => "error",
        other => {
            return Err(format!(
                "unknown log level {other:?} (debug, info, warn, error, panic, fatal)"
            ))
        }
    };
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
        .with_writer(std::io::stderr)
        .event_format(EtcdJsonFormat)
        .finish();
    tracing::subscriber::set_global_default(subscriber).map_err(|e| e.to_string())?;
    let _ = std::io::stderr().flush();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_strings_are_escaped() {
        assert_eq!(json_string("a\"b\\c\nd\u{1}"), "\"a\\\"b\\\\c\\nd\\u0001\"");
    }

    #[test]
    fn callers_keep_two_path_components() {
        assert_eq!(short_path("crates/server/src/apply.rs"), "server/apply.rs");
        assert_eq!(short_path("apply.rs"), "apply.rs");
    }
}
