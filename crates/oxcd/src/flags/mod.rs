//! etcd's command line: every flag of etcd 3.5 ([`table`]), read as Go's
//! `flag` package reads them (`-name` or `--name`, `--name=value` or
//! `--name value`, a bool as `--flag` or `--flag=false`, never `--flag
//! false`), then the `ETCD_*` variables as etcd's `pkg/flags`
//! `SetFlagsFromEnv` reads them. Errors carry etcd's words. Pure: the
//! arguments and the environment come in, values and the log lines etcd
//! would print come out.

mod help;
mod table;
mod values;

use std::collections::BTreeSet;

pub use help::{help_text, USAGE};
pub(crate) use values::split_host_port;
pub use values::Value;

/// Go's `strconv.ParseInt(text, 0, 64)`.
pub(crate) fn go_parse_int(text: &str) -> Result<i64, ()> {
    values::parse_int(text).map_err(|_| ())
}

/// Go's `strconv.ParseUint(text, 0, 64)`.
pub(crate) fn go_parse_uint(text: &str) -> Result<u64, ()> {
    values::parse_uint(text, 64).map_err(|_| ())
}

/// `spec`'s value for `text`, as the flag would take it.
pub(crate) fn set_text(spec: &Spec, text: &str) -> Result<Value, String> {
    values::set(spec, text)
}

/// How a flag's value is read (etcd's `flag.Value` types).
#[derive(Debug, Clone, Copy)]
pub enum Kind {
    Bool,
    Str,
    /// Go's `uint` (64 bits here), base prefixes allowed.
    Uint,
    Uint64,
    /// etcd's `uint32Value` (`--max-concurrent-streams`).
    Uint32,
    Int,
    Duration,
    /// etcd's `UniqueURLs`: comma-separated URLs, or one of the exceptions.
    Urls(&'static [&'static str]),
    /// etcd's `StringsValue`: comma-separated strings.
    Strings,
    /// etcd's `UniqueStringsValue`: comma-separated, deduplicated, sorted.
    UniqueStrings,
    /// etcd's `SelectiveStringValue`: one of these.
    OneOf(&'static [&'static str]),
    /// etcd's `SelectiveStringsValue`: comma-separated, each one of these.
    SomeOf(&'static [&'static str]),
    /// etcdmain's `ignored` flags of old releases (a bool flag).
    Ignored,
}

/// The sections of etcd's `--help`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Group {
    Member,
    Clustering,
    Security,
    Auth,
    Profiling,
    Logging,
    Tracing,
    Proxy,
    Experimental,
    Unsafe,
    /// Not in a section of the help (`--config-file`, `--version`, ignored).
    Hidden,
}

/// What a flag does in oxcd.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Effect {
    Effective,
    /// Accepted and validated; when given, logged once at start as having no
    /// effect, with the reason (it tunes something oxcd does not have).
    NoEffect(&'static str),
    /// Accepted at its default; any other value is refused at start, with the
    /// reason (ignoring it would start a different member than asked for).
    Refused(&'static str),
}

/// One flag: etcd's name, type, default and help text.
#[derive(Debug)]
pub struct Spec {
    pub name: &'static str,
    pub kind: Kind,
    /// The default, as Go would parse it.
    pub default: &'static str,
    /// The default as etcd's `--help` shows it, quotes included (None: not
    /// shown).
    pub shown: Option<&'static str>,
    pub group: Group,
    pub usage: &'static str,
    pub effect: Effect,
}

/// Every flag oxcd takes.
pub fn specs() -> &'static [Spec] {
    table::FLAGS
}

/// The flag named `name`.
pub fn spec(name: &str) -> Option<&'static Spec> {
    table::FLAGS.iter().find(|s| s.name == name)
}

/// `spec`'s default value.
pub fn set_default(spec: &Spec) -> Value {
    values::set(spec, spec.default)
        .unwrap_or_else(|e| panic!("the default of --{} does not parse: {e}", spec.name))
}

/// etcd's `flags.FlagToEnv("ETCD", name)`.
pub fn env_name(flag: &str) -> String {
    format!("ETCD_{}", flag.replace('-', "_").to_uppercase())
}

/// Where a flag's value came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    Default,
    CommandLine,
    Environment,
    /// A key of the `--config-file` file.
    ConfigFile,
}

/// A line etcd would log while reading its flags.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Note {
    pub level: Level,
    pub msg: &'static str,
    pub fields: Vec<(&'static str, String)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    Info,
    Warn,
    /// etcd's `lg.Fatal`: logged, then exit 1.
    Fatal,
}

/// Every flag's value, and where it came from.
#[derive(Debug, Clone)]
pub struct Flags {
    values: Vec<(Value, Source)>,
    /// The lines etcd logs while reading flags and variables, in order; a
    /// [`Level::Fatal`] one is the last.
    pub notes: Vec<Note>,
    /// `--config-file` or `ETCD_CONFIG_FILE`: the file to read instead of
    /// the other flags and variables (see [`crate::config_file`]).
    config_file: Option<String>,
    /// These values were read from that file.
    loaded_from_file: bool,
    /// The config file's `client-transport-security.allowed-cn`, which no
    /// flag sets.
    pub(crate) client_allowed_cns: Vec<String>,
}

/// What the command line asks for.
#[derive(Debug)]
pub enum Parsed {
    Run(Box<Flags>),
    Help,
    Version,
}

/// A command line etcd refuses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseError {
    pub message: String,
    /// Go's flag package errors: printed with the usage, exit status 2.
    /// Otherwise (etcd's own checks): logged, exit status 1.
    pub usage: bool,
}

impl ParseError {
    fn go(message: String) -> ParseError {
        ParseError {
            message,
            usage: true,
        }
    }
}

impl Flags {
    /// Every flag at its default, as etcd's `embed.NewConfig`, to be set
    /// from a config file.
    pub(crate) fn for_file(config_file: &str, notes: Vec<Note>) -> Flags {
        Flags {
            values: table::FLAGS
                .iter()
                .map(|s| (set_default(s), Source::Default))
                .collect(),
            notes,
            config_file: Some(config_file.to_string()),
            loaded_from_file: true,
            client_allowed_cns: Vec::new(),
        }
    }

    /// Sets `name` from the config file.
    pub(crate) fn set_from_file(&mut self, name: &str, value: Value) {
        self.values[Flags::index(name)] = (value, Source::ConfigFile);
    }

    /// The config file to read, when one is named: then every other flag
    /// and variable is ignored, as etcd does.
    pub fn config_file(&self) -> Option<&str> {
        self.config_file.as_deref()
    }

    /// The values came from a config file.
    pub fn loaded_from_file(&self) -> bool {
        self.loaded_from_file
    }

    fn index(name: &str) -> usize {
        table::FLAGS
            .iter()
            .position(|s| s.name == name)
            .unwrap_or_else(|| panic!("no flag --{name} in the table"))
    }

    pub fn value(&self, name: &str) -> &Value {
        &self.values[Flags::index(name)].0
    }

    pub fn source(&self, name: &str) -> Source {
        self.values[Flags::index(name)].1
    }

    /// Given on the command line or through its variable.
    pub fn is_set(&self, name: &str) -> bool {
        self.source(name) != Source::Default
    }

    pub fn str(&self, name: &str) -> &str {
        match self.value(name) {
            Value::Str(s) => s,
            other => panic!("--{name} is not a string: {other:?}"),
        }
    }

    pub fn bool(&self, name: &str) -> bool {
        match self.value(name) {
            Value::Bool(b) => *b,
            other => panic!("--{name} is not a bool: {other:?}"),
        }
    }

    pub fn uint(&self, name: &str) -> u64 {
        match self.value(name) {
            Value::Uint(n) => *n,
            other => panic!("--{name} is not unsigned: {other:?}"),
        }
    }

    pub fn int(&self, name: &str) -> i64 {
        match self.value(name) {
            Value::Int(n) => *n,
            other => panic!("--{name} is not an integer: {other:?}"),
        }
    }

    /// A Go duration, in nanoseconds (negative allowed, as Go).
    pub fn nanos(&self, name: &str) -> i64 {
        match self.value(name) {
            Value::Nanos(n) => *n,
            other => panic!("--{name} is not a duration: {other:?}"),
        }
    }

    /// A non-negative Go duration (a negative one is zero).
    pub fn duration(&self, name: &str) -> std::time::Duration {
        std::time::Duration::from_nanos(self.nanos(name).max(0) as u64)
    }

    pub fn list(&self, name: &str) -> &[String] {
        match self.value(name) {
            Value::List(l) => l,
            other => panic!("--{name} is not a list: {other:?}"),
        }
    }
}

/// Reads `args` (without the program name) as etcd's `newConfig` flag set
/// and `config.parse` do, then `env` (`KEY=VALUE` pairs, in order) as
/// `SetFlagsFromEnv` does.
pub fn parse(args: &[String], env: &[(String, String)]) -> Result<Parsed, ParseError> {
    let specs = table::FLAGS;
    let mut values: Vec<(Value, Source)> = specs
        .iter()
        .map(|s| (set_default(s), Source::Default))
        .collect();
    let mut notes = Vec::new();
    let mut rest = args.iter();
    let mut positional = None;
    while let Some(arg) = rest.next() {
        if arg.len() < 2 || !arg.starts_with('-') {
            positional = Some(arg.clone());
            break;
        }
        let minuses = if arg.starts_with("--") { 2 } else { 1 };
        if minuses == 2 && arg.len() == 2 {
            // "--" ends the flags
            positional = rest.next().cloned();
            break;
        }
        let body = &arg[minuses..];
        if body.is_empty() || body.starts_with('-') || body.starts_with('=') {
            return Err(ParseError::go(format!("bad flag syntax: {arg}")));
        }
        let (name, inline) = match body.split_once('=') {
            Some((name, value)) => (name, Some(value.to_string())),
            None => (body, None),
        };
        let Some(index) = specs.iter().position(|s| s.name == name) else {
            if name == "help" || name == "h" {
                return Ok(Parsed::Help);
            }
            return Err(ParseError::go(format!(
                "flag provided but not defined: -{name}"
            )));
        };
        let spec = &specs[index];
        if values[index].1 == Source::CommandLine {
            // Go takes the last; oxcd refuses: a repeated flag is a mistake
            return Err(ParseError::go(format!(
                "flag provided more than once: -{name}"
            )));
        }
        let value = match (spec.kind, inline) {
            (Kind::Bool | Kind::Ignored, Some(text)) => values::set(spec, &text).map_err(|e| {
                ParseError::go(format!("invalid boolean value {text:?} for -{name}: {e}"))
            })?,
            (Kind::Bool | Kind::Ignored, None) => values::set(spec, "true")
                .map_err(|e| ParseError::go(format!("invalid boolean flag {name}: {e}")))?,
            (_, inline) => {
                let text = match inline.or_else(|| rest.next().cloned()) {
                    Some(text) => text,
                    None => return Err(ParseError::go(format!("flag needs an argument: -{name}"))),
                };
                values::set(spec, &text).map_err(|e| {
                    ParseError::go(format!("invalid value {text:?} for flag -{name}: {e}"))
                })?
            }
        };
        if matches!(spec.kind, Kind::Ignored) {
            notes.push(ignored_note(name));
        }
        values[index] = (value, Source::CommandLine);
    }
    if let Some(arg) = positional {
        return Err(ParseError {
            message: format!("'{arg}' is not a valid flag"),
            usage: false,
        });
    }
    let flags = Flags {
        values,
        notes,
        config_file: None,
        loaded_from_file: false,
        client_allowed_cns: Vec::new(),
    };
    if flags.bool("version") {
        return Ok(Parsed::Version);
    }
    let mut flags = flags;
    // etcdmain reads ETCD_CONFIG_FILE on its own, before any other
    // variable: with a config file, the variables are not read at all
    let config_file = match flags.str("config-file") {
        "" => env
            .iter()
            .rev()
            .find(|(key, _)| *key == env_name("config-file"))
            .map(|(_, value)| value.clone())
            .filter(|value| !value.is_empty()),
        path => Some(path.to_string()),
    };
    if config_file.is_some() {
        flags.config_file = config_file;
        return Ok(Parsed::Run(Box::new(flags)));
    }
    apply_env(&mut flags, env)?;
    Ok(Parsed::Run(Box::new(flags)))
}

fn ignored_note(name: &str) -> Note {
    Note {
        level: Level::Warn,
        msg: "flag is no longer supported - ignoring",
        fields: vec![("flag-name", name.to_string())],
    }
}

/// etcdmain's `configFromCmdLine` and pkg/flags' `SetFlagsFromEnv` and
/// `verifyEnv`: `ETCD_VERSION` is dropped with a warning; a flag not on
/// the command line takes its non-empty variable (logged); a variable for
/// a flag that is on the command line is fatal; any other `ETCD_*`
/// variable is warned about.
fn apply_env(flags: &mut Flags, env: &[(String, String)]) -> Result<(), ParseError> {
    let version_key = env_name("version");
    let env: Vec<&(String, String)> = env
        .iter()
        .filter(|(key, value)| {
            let special = *key == version_key && !value.is_empty();
            if special {
                flags.notes.push(Note {
                    level: Level::Warn,
                    msg: "cannot set special environment variable",
                    fields: vec![("key", key.clone()), ("value", value.clone())],
                });
            }
            !special
        })
        .collect();
    let already_set: BTreeSet<String> = table::FLAGS
        .iter()
        .enumerate()
        .filter(|(i, _)| flags.values[*i].1 == Source::CommandLine)
        .map(|(_, s)| env_name(s.name))
        .collect();
    let mut used = BTreeSet::new();
    for (index, spec) in table::FLAGS.iter().enumerate() {
        let key = env_name(spec.name);
        if already_set.contains(&key) {
            continue;
        }
        let Some((_, text)) = env.iter().rev().find(|(k, _)| *k == key) else {
            continue;
        };
        if text.is_empty() {
            continue;
        }
        used.insert(key.clone());
        let value = values::set(spec, text).map_err(|e| ParseError {
            message: format!("invalid value {text:?} for {key}: {e}"),
            usage: false,
        })?;
        if matches!(spec.kind, Kind::Ignored) {
            flags.notes.push(ignored_note(spec.name));
        }
        flags.values[index] = (value, Source::Environment);
        flags.notes.push(Note {
            level: Level::Info,
            msg: "recognized and used environment variable",
            fields: vec![("variable-name", key), ("variable-value", text.clone())],
        });
    }
    for (key, value) in env {
        if used.contains(key) {
            continue;
        }
        if already_set.contains(key) {
            flags.notes.push(Note {
                level: Level::Fatal,
                // etcd's message, its doubled parenthesis included
                msg: "conflicting environment variable is shadowed by corresponding command-line flag (either unset environment variable or disable flag))",
                fields: vec![("environment-variable", key.clone())],
            });
            return Ok(());
        }
        if key.starts_with("ETCD_") {
            flags.notes.push(Note {
                level: Level::Warn,
                msg: "unrecognized environment variable",
                fields: vec![("environment-variable", format!("{key}={value}"))],
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
