//! raft-rs logs through `slog`; this drain turns each slog record into a
//! `tracing` event (target `raft`) so raft's lines land in the member's log.
//!
//! Lines are prefixed with the member id in hex, as etcd's raft logger does,
//! so `8e9e05c52164694d became leader at term 2` is the message verbatim;
//! raft-rs's key-values (often repeating the message's numbers) go in a
//! `fields` field as `key=value`.

use std::fmt::{self, Write as _};

use slog::{Drain, Key, Level, OwnedKVList, Record, Serializer, KV};

/// The slog drain that forwards to `tracing`.
pub(crate) struct TracingDrain;

struct Collect {
    raft_id: Option<u64>,
    pairs: String,
}

impl Serializer for Collect {
    fn emit_arguments(&mut self, key: Key, val: &fmt::Arguments) -> slog::Result {
        if key == "raft_id" {
            if let Ok(id) = val.to_string().parse::<u64>() {
                self.raft_id = Some(id);
                return Ok(());
            }
        }
        let _ = write!(self.pairs, " {key}={val}");
        Ok(())
    }
}

impl Drain for TracingDrain {
    type Ok = ();
    type Err = slog::Never;

    fn log(&self, record: &Record, values: &OwnedKVList) -> Result<(), slog::Never> {
        let mut kv = Collect {
            raft_id: None,
            pairs: String::new(),
        };
        let _ = record.kv().serialize(record, &mut kv);
        let _ = values.serialize(record, &mut kv);
        let line = match kv.raft_id {
            Some(id) => format!("{id:x} {}", record.msg()),
            None => record.msg().to_string(),
        };
        let fields = kv.pairs.trim_start();
        // etcd's raft lines carry "logger":"raft" and no other field
        macro_rules! log {
            ($level:ident) => {
                if fields.is_empty() {
                    tracing::$level!(target: "raft", logger = "raft", "{line}")
                } else {
                    tracing::$level!(target: "raft", logger = "raft", fields, "{line}")
                }
            };
        }
        match record.level() {
            Level::Critical | Level::Error => log!(error),
            Level::Warning => log!(warn),
            Level::Info => log!(info),
            Level::Debug => log!(debug),
            Level::Trace => log!(trace),
        }
        Ok(())
    }
}

/// A slog logger for raft-rs that writes through `tracing`.
pub(crate) fn raft_logger() -> slog::Logger {
    slog::Logger::root(TracingDrain, slog::o!())
}
