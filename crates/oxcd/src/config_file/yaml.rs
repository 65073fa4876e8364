//! A YAML document to the JSON value etcd's `sigs.k8s.io/yaml` makes of it
//! before `encoding/json` decodes that into etcd's config struct: plain
//! scalars resolved with yaml.v2's YAML 1.1 rules (`yes`, `on`, `off` are
//! booleans, `0x1F` and `017` are integers, `~` is null), quoted ones kept
//! as strings, mapping keys as strings, the last of duplicate keys kept,
//! only the first document read.

use std::collections::{BTreeMap, HashMap};

use yaml_rust2::parser::{Event, MarkedEventReceiver, Parser};
use yaml_rust2::scanner::{Marker, TScalarStyle};

/// A JSON value; a number keeps the literal Go's `json.Marshal` writes.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Json {
    Null,
    Bool(bool),
    Number(String),
    Str(String),
    Array(Vec<Json>),
    /// Sorted by key, as `json.Marshal` writes a map.
    Object(BTreeMap<String, Json>),
}

impl Json {
    /// The word `encoding/json` uses for this value in a type error.
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            Json::Null => "null",
            Json::Bool(_) => "bool",
            Json::Number(_) => "number",
            Json::Str(_) => "string",
            Json::Array(_) => "array",
            Json::Object(_) => "object",
        }
    }
}

/// The YAML tree before resolution: a scalar keeps its style.
#[derive(Debug, Clone)]
enum Node {
    Scalar {
        text: String,
        plain: bool,
        /// `!!str` (or yaml.org's str tag): a string whatever it looks like.
        string_tag: bool,
    },
    Seq(Vec<Node>),
    Map(Vec<(Node, Node)>),
}

enum Open {
    Seq(Vec<Node>),
    Map(Vec<(Node, Node)>, Option<Node>),
}

/// Bound on nesting: a crafted file must not exhaust the stack.
const MAX_DEPTH: usize = 64;

#[derive(Default)]
struct Builder {
    open: Vec<(Open, usize)>,
    anchors: HashMap<usize, Node>,
    document: Option<Node>,
    too_deep: bool,
}

impl Builder {
    fn add(&mut self, node: Node, anchor: usize) {
        if anchor > 0 {
            self.anchors.insert(anchor, node.clone());
        }
        match self.open.last_mut() {
            None => {
                if self.document.is_none() {
                    self.document = Some(node);
                }
            }
            Some((Open::Seq(items), _)) => items.push(node),
            Some((Open::Map(entries, pending), _)) => match pending.take() {
                None => *pending = Some(node),
                Some(key) => entries.push((key, node)),
            },
        }
    }
}

impl MarkedEventReceiver for Builder {
    fn on_event(&mut self, event: Event, _mark: Marker) {
        match event {
            Event::Scalar(text, style, anchor, tag) => {
                let string_tag =
                    tag.is_some_and(|t| t.suffix == "str" || t.suffix == "tag:yaml.org,2002:str");
                let plain = style == TScalarStyle::Plain;
                self.add(
                    Node::Scalar {
                        text,
                        plain,
                        string_tag,
                    },
                    anchor,
                );
            }
            Event::SequenceStart(anchor, _) => {
                self.too_deep |= self.open.len() >= MAX_DEPTH;
                self.open.push((Open::Seq(Vec::new()), anchor));
            }
            Event::MappingStart(anchor, _) => {
                self.too_deep |= self.open.len() >= MAX_DEPTH;
                self.open.push((Open::Map(Vec::new(), None), anchor));
            }
            Event::SequenceEnd | Event::MappingEnd => {
                if let Some((open, anchor)) = self.open.pop() {
                    let node = match open {
                        Open::Seq(items) => Node::Seq(items),
                        Open::Map(entries, _) => Node::Map(entries),
                    };
                    self.add(node, anchor);
                }
            }
            Event::Alias(anchor) => {
                let node = self.anchors.get(&anchor).cloned().unwrap_or(Node::Scalar {
                    text: String::new(),
                    plain: true,
                    string_tag: false,
                });
                self.add(node, 0);
            }
            _ => {}
        }
    }
}

/// `text` as sigs.k8s.io/yaml's `YAMLToJSON` sees it, or its error in
/// etcd's words (`error converting YAML to JSON: yaml: line N: ...`).
pub(crate) fn to_json(text: &str) -> Result<Json, String> {
    let mut builder = Builder::default();
    let mut parser = Parser::new_from_str(text);
    if let Err(e) = parser.load(&mut builder, false) {
        return Err(format!(
            "error converting YAML to JSON: yaml: {}",
            syntax_error(e.info(), e.marker().line())
        ));
    }
    if builder.too_deep {
        return Err(format!(
            "error converting YAML to JSON: yaml: exceeded max depth of {MAX_DEPTH}"
        ));
    }
    match builder.document {
        None => Ok(Json::Null),
        Some(node) => convert(&node).map_err(|e| format!("error converting YAML to JSON: {e}")),
    }
}

/// A parse error as yaml.v2 words it: the problem without its context
/// ("while parsing a block mapping, "), after `line N: ` where N is the
/// problem's 0-based line for a parser error and its 1-based line for a
/// scanner error, and no line at all on the first line (yaml.v2's
/// `parser.fail`). `line` is yaml-rust2's 1-based line.
fn syntax_error(info: &str, line: usize) -> String {
    let parser_error = info.starts_with("while parsing") || info.starts_with("did not find");
    let problem = match info.strip_prefix("while ") {
        Some(rest) => rest.split_once(", ").map_or(info, |(_, problem)| problem),
        None => info,
    };
    let problem = match problem.strip_prefix("expected ") {
        Some(rest) if parser_error => format!("did not find expected {rest}"),
        _ => problem.to_string(),
    };
    let zero_based = line.saturating_sub(1);
    match (zero_based, parser_error) {
        (0, _) => problem,
        (n, true) => format!("line {n}: {problem}"),
        (n, false) => format!("line {}: {problem}", n + 1),
    }
}

fn convert(node: &Node) -> Result<Json, String> {
    match node {
        Node::Scalar {
            text,
            plain,
            string_tag,
        } => {
            if *string_tag || !*plain {
                Ok(Json::Str(text.clone()))
            } else {
                resolve_plain(text)
            }
        }
        Node::Seq(items) => items
            .iter()
            .map(convert)
            .collect::<Result<_, _>>()
            .map(Json::Array),
        Node::Map(entries) => {
            let mut object = BTreeMap::new();
            for (key, value) in entries {
                object.insert(key_text(key)?, convert(value)?);
            }
            Ok(Json::Object(object))
        }
    }
}

/// A mapping key as the JSON object key sigs.k8s.io/yaml writes.
fn key_text(key: &Node) -> Result<String, String> {
    match convert(key)? {
        Json::Str(s) | Json::Number(s) => Ok(s),
        Json::Bool(b) => Ok(b.to_string()),
        Json::Null => Ok("null".to_string()),
        other => Err(format!("Unsupported map key of type: {}", other.kind())),
    }
}

/// yaml.v2's `resolve` of a plain scalar.
fn resolve_plain(text: &str) -> Result<Json, String> {
    match text {
        "" | "~" | "null" | "Null" | "NULL" => return Ok(Json::Null),
        "y" | "Y" | "yes" | "Yes" | "YES" | "true" | "True" | "TRUE" | "on" | "On" | "ON" => {
            return Ok(Json::Bool(true))
        }
        "n" | "N" | "no" | "No" | "NO" | "false" | "False" | "FALSE" | "off" | "Off" | "OFF" => {
            return Ok(Json::Bool(false))
        }
        ".inf" | ".Inf" | ".INF" | "+.inf" | "+.Inf" | "+.INF" => {
            return Err("json: unsupported value: +Inf".into())
        }
        "-.inf" | "-.Inf" | "-.INF" => return Err("json: unsupported value: -Inf".into()),
        ".nan" | ".NaN" | ".NAN" => return Err("json: unsupported value: NaN".into()),
        _ => {}
    }
    let first = text.as_bytes()[0];
    if !(first.is_ascii_digit() || first == b'-' || first == b'+' || first == b'.') {
        return Ok(Json::Str(text.to_string()));
    }
    let plain = text.replace('_', "");
    if let Ok(n) = crate::flags::go_parse_int(&plain) {
        return Ok(Json::Number(n.to_string()));
    }
    if let Ok(n) = crate::flags::go_parse_uint(&plain) {
        return Ok(Json::Number(n.to_string()));
    }
    if let Some(binary) = plain.strip_prefix("0b") {
        if let Ok(n) = i64::from_str_radix(binary, 2) {
            return Ok(Json::Number(n.to_string()));
        }
    }
    if is_yaml_float(&plain) {
        if let Ok(f) = plain.parse::<f64>() {
            return go_float(f).map(Json::Number);
        }
    }
    Ok(Json::Str(text.to_string()))
}

/// yaml.v2's `^[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?$`.
fn is_yaml_float(text: &str) -> bool {
    let s = text.strip_prefix(['-', '+']).unwrap_or(text);
    let (mantissa, exponent) = match s.find(['e', 'E']) {
        Some(i) => (&s[..i], Some(&s[i + 1..])),
        None => (s, None),
    };
    let digits = |t: &str| !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit());
    let mantissa_ok = match mantissa.split_once('.') {
        Some(("", frac)) => digits(frac),
        Some((int, frac)) => digits(int) && (frac.is_empty() || digits(frac)),
        None => digits(mantissa),
    };
    let exponent_ok = exponent.is_none_or(|e| digits(e.strip_prefix(['-', '+']).unwrap_or(e)));
    mantissa_ok && exponent_ok
}

/// A float64 as Go's `json.Marshal` writes it.
fn go_float(f: f64) -> Result<String, String> {
    if f.is_nan() {
        return Err("json: unsupported value: NaN".into());
    }
    if f.is_infinite() {
        let sign = if f > 0.0 { "+" } else { "-" };
        return Err(format!("json: unsupported value: {sign}Inf"));
    }
    let magnitude = f.abs();
    if magnitude == 0.0 || (1e-6..1e21).contains(&magnitude) {
        return Ok(format!("{f}"));
    }
    let text = format!("{f:e}");
    Ok(match text.split_once('e') {
        Some((m, e)) if !e.starts_with('-') => format!("{m}e+{e}"),
        _ => text,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object(text: &str) -> BTreeMap<String, Json> {
        match to_json(text).unwrap() {
            Json::Object(o) => o,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn plain_scalars_resolve_as_yaml_v2() {
        let o = object("a: yes\nb: 'yes'\nc: off\nd: 0x10\ne: 1.5\nf: 99999999999999999999\ng: ~\nh:\ni: 1_000\nj: !!str 12\nk: 1e25\nl: 017\n");
        assert_eq!(o["a"], Json::Bool(true));
        assert_eq!(o["b"], Json::Str("yes".into()));
        assert_eq!(o["c"], Json::Bool(false));
        assert_eq!(o["d"], Json::Number("16".into()));
        assert_eq!(o["e"], Json::Number("1.5".into()));
        assert_eq!(o["f"], Json::Number("100000000000000000000".into()));
        assert_eq!(o["g"], Json::Null);
        assert_eq!(o["h"], Json::Null);
        assert_eq!(o["i"], Json::Number("1000".into()));
        assert_eq!(o["j"], Json::Str("12".into()));
        assert_eq!(o["k"], Json::Number("1e+25".into()));
        assert_eq!(o["l"], Json::Number("15".into()));
    }

    #[test]
    fn anchors_lists_and_the_last_duplicate() {
        let o = object("a: &x [stderr, /var/log/etcd]\nb: *x\nc: 1\nc: 2\n");
        assert_eq!(o["b"], o["a"]);
        assert_eq!(o["c"], Json::Number("2".into()));
    }

    #[test]
    fn syntax_errors_name_the_line() {
        // etcd 3.5.16's words for these
        let err = to_json("name: x\nlist: [a, b\n").unwrap_err();
        assert_eq!(
            err,
            "error converting YAML to JSON: yaml: line 2: did not find expected ',' or ']'"
        );
        let err = to_json("a:\n  b: 1\n c: 2\n").unwrap_err();
        assert_eq!(
            err,
            "error converting YAML to JSON: yaml: line 2: did not find expected key"
        );
        let err = to_json("name: x: y\n").unwrap_err();
        assert_eq!(
            err,
            "error converting YAML to JSON: yaml: mapping values are not allowed in this context"
        );
        assert_eq!(to_json("").unwrap(), Json::Null);
    }
}
