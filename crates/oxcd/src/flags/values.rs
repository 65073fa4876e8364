//! A flag's text to its value, with the errors Go's `flag` values and
//! etcd's `pkg/flags` values give.

use super::{Kind, Spec};

/// A flag's value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    Bool(bool),
    Str(String),
    Uint(u64),
    Int(i64),
    /// A Go `time.Duration`.
    Nanos(i64),
    List(Vec<String>),
}

/// Go's `errParse` and `errRange` as the flag package prints them.
const PARSE_ERROR: &str = "parse error";
const RANGE_ERROR: &str = "value out of range";

/// `spec`'s `Value.Set(text)`.
pub(crate) fn set(spec: &Spec, text: &str) -> Result<Value, String> {
    match spec.kind {
        Kind::Bool => parse_bool(text).map(Value::Bool),
        Kind::Ignored => Ok(Value::Bool(true)),
        Kind::Str => Ok(Value::Str(text.to_string())),
        Kind::Uint | Kind::Uint64 => parse_uint(text, 64)
            .map(Value::Uint)
            .map_err(|e| e.flag_text().to_string()),
        // etcd's uint32Value returns strconv's error as it is
        Kind::Uint32 => parse_uint(text, 32).map(Value::Uint).map_err(|e| {
            let why = match e {
                NumError::Syntax => "invalid syntax",
                NumError::Range => "value out of range",
            };
            format!("strconv.ParseUint: parsing {text:?}: {why}")
        }),
        Kind::Int => parse_int(text)
            .map(Value::Int)
            .map_err(|e| e.flag_text().to_string()),
        Kind::Duration => etcdserver::go_duration_nanos(text)
            .map(Value::Nanos)
            .map_err(|_| PARSE_ERROR.to_string()),
        Kind::Urls(exceptions) => {
            if exceptions.contains(&text) {
                return Ok(Value::List(
                    Some(text.to_string())
                        .filter(|t| !t.is_empty())
                        .into_iter()
                        .collect(),
                ));
            }
            let mut urls: Vec<String> = Vec::new();
            for url in text.split(',') {
                let url = check_url(url.trim())?;
                if !urls.contains(&url) {
                    urls.push(url);
                }
            }
            Ok(Value::List(urls))
        }
        Kind::Strings => Ok(Value::List(
            text.split(',')
                .filter(|s| !s.is_empty())
                .map(String::from)
                .collect(),
        )),
        Kind::UniqueStrings => {
            let set: std::collections::BTreeSet<&str> = text.split(',').collect();
            Ok(Value::List(set.into_iter().map(String::from).collect()))
        }
        Kind::OneOf(valid) => {
            if valid.contains(&text) {
                Ok(Value::Str(text.to_string()))
            } else {
                Err("invalid value".to_string())
            }
        }
        Kind::SomeOf(valid) => {
            let mut chosen = Vec::new();
            for item in text.split(',') {
                if !valid.contains(&item) {
                    return Err(format!("invalid value {item:?}"));
                }
                chosen.push(item.to_string());
            }
            chosen.sort();
            Ok(Value::List(chosen))
        }
    }
}

/// Go's `strconv.ParseBool`.
fn parse_bool(text: &str) -> Result<bool, String> {
    match text {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Ok(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Ok(false),
        _ => Err(PARSE_ERROR.to_string()),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NumError {
    Syntax,
    Range,
}

impl NumError {
    fn flag_text(self) -> &'static str {
        match self {
            NumError::Syntax => PARSE_ERROR,
            NumError::Range => RANGE_ERROR,
        }
    }
}

/// Go's `strconv.ParseUint(text, 0, bits)`: `0x`, `0o`, `0b` and a leading
/// `0` (octal) choose the base; `_` may separate digits after a prefix.
pub(crate) fn parse_uint(text: &str, bits: u32) -> Result<u64, NumError> {
    let (digits, base, prefixed) = match text.as_bytes() {
        [b'0', b'x' | b'X', ..] => (&text[2..], 16, true),
        [b'0', b'o' | b'O', ..] => (&text[2..], 8, true),
        [b'0', b'b' | b'B', ..] => (&text[2..], 2, true),
        [b'0', _, ..] => (&text[1..], 8, true),
        _ => (text, 10, false),
    };
    if digits.is_empty() {
        return Err(NumError::Syntax);
    }
    let cleaned: String = if prefixed && digits.contains('_') {
        if digits.ends_with('_') || digits.contains("__") {
            return Err(NumError::Syntax);
        }
        digits.replace('_', "")
    } else if digits.contains('_') {
        return Err(NumError::Syntax);
    } else {
        digits.to_string()
    };
    if cleaned.is_empty() || !cleaned.chars().all(|c| c.is_digit(base)) {
        return Err(NumError::Syntax);
    }
    let value = u64::from_str_radix(&cleaned, base).map_err(|_| NumError::Range)?;
    if bits < 64 && value >> bits != 0 {
        return Err(NumError::Range);
    }
    Ok(value)
}

/// Go's `strconv.ParseInt(text, 0, 64)`.
pub(crate) fn parse_int(text: &str) -> Result<i64, NumError> {
    let (negative, magnitude) = match text.as_bytes().first() {
        Some(b'-') => (true, &text[1..]),
        Some(b'+') => (false, &text[1..]),
        _ => (false, text),
    };
    let value = parse_uint(magnitude, 64)?;
    if negative {
        if value > 1 << 63 {
            return Err(NumError::Range);
        }
        Ok((value as i64).wrapping_neg())
    } else {
        i64::try_from(value).map_err(|_| NumError::Range)
    }
}

/// etcd's `types.NewURLs` check of one URL: http(s) with `host:port` and
/// no path, or unix(s).
fn check_url(url: &str) -> Result<String, String> {
    let scheme_ok = |s: &str| {
        s.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c))
    };
    let (scheme, rest) = match url.split_once(':') {
        Some((scheme, rest)) if scheme_ok(scheme) => (scheme.to_ascii_lowercase(), rest),
        _ => (String::new(), url),
    };
    match scheme.as_str() {
        "http" | "https" => {
            let authority = rest.strip_prefix("//").unwrap_or("");
            let end = authority.find(['/', '?', '#']).unwrap_or(authority.len());
            let (host_port, path) = authority.split_at(end);
            let host_port = host_port.rsplit_once('@').map_or(host_port, |(_, h)| h);
            if split_host_port(host_port).is_none() {
                return Err(format!(
                    "URL address does not have the form \"host:port\": {url}"
                ));
            }
            let path = path.split(['?', '#']).next().unwrap_or("");
            if !path.is_empty() {
                return Err(format!("URL must not contain a path: {url}"));
            }
            Ok(url.to_string())
        }
        "unix" | "unixs" => Ok(url.to_string()),
        _ => Err(format!(
            "URL scheme must be http, https, unix, or unixs: {url}"
        )),
    }
}

/// Go's `net.SplitHostPort`: `host:port` or `[v6]:port`.
pub(crate) fn split_host_port(text: &str) -> Option<(&str, &str)> {
    if let Some(rest) = text.strip_prefix('[') {
        let (host, after) = rest.split_once(']')?;
        let port = after.strip_prefix(':')?;
        if port.contains(':') {
            return None;
        }
        return Some((host, port));
    }
    let (host, port) = text.rsplit_once(':')?;
    if host.contains(':') || host.contains('[') || host.contains(']') {
        return None;
    }
    Some((host, port))
}
