//! Go's conversions the token format depends on: time.ParseDuration,
//! encoding/json strings, and float64 claim numbers as golang-jwt reads them.

use super::*;

/// golang-jwt's newNumericDateFromSeconds truncated to the second: the
/// floor of `seconds`.
pub(super) fn go_numeric_date(seconds: f64) -> i64 {
    let whole = go_int64(seconds.trunc());
    if seconds < seconds.trunc() {
        whole.wrapping_sub(1)
    } else {
        whole
    }
}

pub(super) const TWO_POW_63: f64 = 9_223_372_036_854_775_808.0;

/// Go's `int64(f)` as amd64 computes it: NaN and values out of range give
/// the minimum.
pub(super) fn go_int64(f: f64) -> i64 {
    if f.is_nan() || !(-TWO_POW_63..TWO_POW_63).contains(&f) {
        i64::MIN
    } else {
        f as i64
    }
}

/// Go's `uint64(f)` as amd64 computes it (negative values wrap around).
pub(super) fn go_uint64(f: f64) -> u64 {
    if f < TWO_POW_63 {
        go_int64(f) as u64
    } else {
        go_int64(f - TWO_POW_63) as u64 | (1 << 63)
    }
}

/// `s` as a JSON string the way Go's encoding/json (1.22) writes it: `<`,
/// `>`, `&`, U+2028 and U+2029 escaped as `\u00XX`, `\b` and `\f` short.
pub(super) fn go_json_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '<' | '>' | '&' | '\u{2028}' | '\u{2029}' | '\0'..='\u{1f}' => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Go's time.ParseDuration as etcd reads `ttl=` ("5m", "1h30m", "300ms",
/// "1.5h"); None for what Go refuses and for negative durations.
#[cfg(test)]
pub(super) fn parse_go_duration(s: &str) -> Option<Duration> {
    let nanos = go_duration_nanos(s).ok()?;
    u64::try_from(nanos).ok().map(Duration::from_nanos)
}

/// Go's time.ParseDuration, in nanoseconds (Go's Duration, an int64).
pub fn go_duration_nanos(text: &str) -> Result<i64, String> {
    let invalid = || format!("time: invalid duration {text:?}");
    let (negative, mut rest) = match text.as_bytes().first() {
        Some(b'-') => (true, &text[1..]),
        Some(b'+') => (false, &text[1..]),
        _ => (false, text),
    };
    if rest == "0" {
        return Ok(0);
    }
    if rest.is_empty() {
        return Err(invalid());
    }
    let mut total: u64 = 0;
    while let Some(&first) = rest.as_bytes().first() {
        if !(first == b'.' || first.is_ascii_digit()) {
            return Err(invalid());
        }
        let (whole, after_whole) = leading_int(rest).ok_or_else(invalid)?;
        let has_whole = after_whole.len() != rest.len();
        rest = after_whole;
        let (mut fraction, mut scale, mut has_fraction) = (0, 1.0, false);
        if let Some(after_dot) = rest.strip_prefix('.') {
            let after_fraction;
            (fraction, scale, after_fraction) = leading_fraction(after_dot);
            has_fraction = after_fraction.len() != after_dot.len();
            rest = after_fraction;
        }
        if !has_whole && !has_fraction {
            return Err(invalid());
        }
        let unit_len = rest
            .bytes()
            .position(|byte| byte == b'.' || byte.is_ascii_digit())
            .unwrap_or(rest.len());
        if unit_len == 0 {
            return Err(format!("time: missing unit in duration {text:?}"));
        }
        let (unit, after_unit) = rest.split_at(unit_len);
        rest = after_unit;
        let unit_nanos: u64 = match unit {
            "ns" => 1,
            "us" | "\u{b5}s" | "\u{3bc}s" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            _ => return Err(format!("time: unknown unit {unit:?} in duration {text:?}")),
        };
        if whole > (1 << 63) / unit_nanos {
            return Err(invalid());
        }
        let mut value = whole * unit_nanos;
        if fraction > 0 {
            // As Go: float64 keeps fractions of an hour accurate to the nanosecond.
            value += (fraction as f64 * (unit_nanos as f64 / scale)) as u64;
            if value > 1 << 63 {
                return Err(invalid());
            }
        }
        total = total
            .checked_add(value)
            .filter(|&total| total <= 1 << 63)
            .ok_or_else(invalid)?;
    }
    if negative {
        // 2^63 negated is i64::MIN, as in Go.
        return Ok((total as i64).wrapping_neg());
    }
    i64::try_from(total).map_err(|_| invalid())
}

/// Go's leadingInt: the leading digits of `s` as a number up to 2^63.
pub(super) fn leading_int(s: &str) -> Option<(u64, &str)> {
    let digits = s.bytes().take_while(u8::is_ascii_digit).count();
    let mut value: u64 = 0;
    for digit in s[..digits].bytes() {
        if value > (1 << 63) / 10 {
            return None;
        }
        value = value * 10 + u64::from(digit - b'0');
        if value > 1 << 63 {
            return None;
        }
    }
    Some((value, &s[digits..]))
}

/// Go's leadingFraction: the leading digits of `s` as a numerator and its
/// power-of-ten scale; digits past what fits are dropped.
pub(super) fn leading_fraction(s: &str) -> (u64, f64, &str) {
    let digits = s.bytes().take_while(u8::is_ascii_digit).count();
    let (mut value, mut scale, mut overflow) = (0u64, 1.0f64, false);
    for digit in s[..digits].bytes() {
        if overflow {
            continue;
        }
        if value > (i64::MAX as u64) / 10 {
            overflow = true;
            continue;
        }
        let next = value * 10 + u64::from(digit - b'0');
        if next > 1 << 63 {
            overflow = true;
            continue;
        }
        value = next;
        scale *= 10.0;
    }
    (value, scale, &s[digits..])
}
