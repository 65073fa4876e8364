//! Go's `%g` (shortest representation) for floats, which etcd's report uses
//! under `--precise`: `strconv.FormatFloat(v, 'g', -1, 64)`.

/// Exponent form when the decimal exponent is below this.
const MIN_FIXED_EXPONENT: i32 = -4;
/// Exponent form when the decimal exponent reaches this: Go fixes it at 6 for
/// the shortest precision ("if precision was the shortest possible, use
/// precision 6 for this decision", strconv/ftoa.go).
const MAX_FIXED_EXPONENT: i32 = 6;

pub fn shortest_g(value: f64) -> String {
    if value.is_nan() {
        return "NaN".into();
    }
    if value.is_infinite() {
        return if value > 0.0 {
            "+Inf".into()
        } else {
            "-Inf".into()
        };
    }
    if value == 0.0 {
        return if value.is_sign_negative() {
            "-0".into()
        } else {
            "0".into()
        };
    }
    // Rust's `{:e}` gives the same shortest round-trip digits Go computes.
    let scientific = format!("{:e}", value.abs());
    let (mantissa, exponent) = scientific.split_once('e').unwrap_or((&scientific, "0"));
    let exponent: i32 = exponent.parse().unwrap_or(0);
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    let sign = if value < 0.0 { "-" } else { "" };
    if !(MIN_FIXED_EXPONENT..MAX_FIXED_EXPONENT).contains(&exponent) {
        let (first, rest) = digits.split_at(1);
        let dot = if rest.is_empty() { "" } else { "." };
        let exp_sign = if exponent < 0 { '-' } else { '+' };
        return format!("{sign}{first}{dot}{rest}e{exp_sign}{:02}", exponent.abs());
    }
    if exponent < 0 {
        let zeros = "0".repeat((-exponent - 1) as usize);
        return format!("{sign}0.{zeros}{digits}");
    }
    let integer_len = exponent as usize + 1;
    if digits.len() <= integer_len {
        let zeros = "0".repeat(integer_len - digits.len());
        format!("{sign}{digits}{zeros}")
    } else {
        let (integer, fraction) = digits.split_at(integer_len);
        format!("{sign}{integer}.{fraction}")
    }
}

#[cfg(test)]
mod tests {
    use super::shortest_g;

    #[test]
    fn matches_go_strconv_g_shortest() {
        for (value, want) in [
            (0.0, "0"),
            (1.0, "1"),
            (10.0, "10"),
            (999999.0, "999999"),
            (1234567.0, "1.234567e+06"),
            (1e6, "1e+06"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (0.000123456, "0.000123456"),
            (0.0123, "0.0123"),
            (12.5, "12.5"),
            (123.456789, "123.456789"),
            (-2.5, "-2.5"),
            (1.5e-7, "1.5e-07"),
            (1e100, "1e+100"),
        ] {
            assert_eq!(shortest_g(value), want, "{value}");
        }
    }
}
