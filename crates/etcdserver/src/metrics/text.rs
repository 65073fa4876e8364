//! The text exposition (format 0.0.4) as etcd writes it: client_golang's
//! promhttp through prometheus/common's expfmt (`MetricFamilyToText`).
//!
//! The prometheus crate's `TextEncoder` lays out the same lines but writes
//! numbers with Rust's `Display`: `17063936` where etcd 3.5.16 writes
//! `etcd_mvcc_db_total_size_in_bytes 1.7063936e+07`, `le="1048576"` where it
//! writes `le="1.048576e+06"`. Every number here, sample value and `le` or
//! `quantile` label alike, goes through expfmt's `writeFloat` instead
//! ([`go_float`]), so that a scrape reads as etcd's does to anything that
//! compares text (dashboards' regexes, diffs against etcd's output).

use std::fmt::Write as _;

use prometheus::proto::{LabelPair, Metric, MetricFamily, MetricType};

/// The exposition of `families` (as `Registry::gather` returns them: sorted
/// by name, each one's metrics by label values). A family without metrics
/// is left out, as client_golang's gatherer leaves it out.
pub fn encode(families: &[MetricFamily]) -> String {
    let mut out = String::with_capacity(64 * 1024);
    for family in families.iter().filter(|f| !f.get_metric().is_empty()) {
        let name = family.name();
        out.push_str("# HELP ");
        out.push_str(name);
        out.push(' ');
        push_escaped(&mut out, family.help(), false);
        out.push_str("\n# TYPE ");
        out.push_str(name);
        out.push_str(match family.get_field_type() {
            MetricType::COUNTER => " counter\n",
            MetricType::GAUGE => " gauge\n",
            MetricType::SUMMARY => " summary\n",
            MetricType::UNTYPED => " untyped\n",
            MetricType::HISTOGRAM => " histogram\n",
        });
        for metric in family.get_metric() {
            push_metric(&mut out, name, family.get_field_type(), metric);
        }
    }
    out
}

fn push_metric(out: &mut String, name: &str, kind: MetricType, metric: &Metric) {
    let mut sample = |suffix: &str, extra_label: Option<(&str, f64)>, value: f64| {
        push_sample(out, name, suffix, metric, extra_label, value)
    };
    match kind {
        MetricType::COUNTER => sample("", None, metric.get_counter().get_value()),
        MetricType::GAUGE => sample("", None, metric.get_gauge().get_value()),
        // none of ours is untyped (the crate's constructors make none); the
        // accessor is deprecated for that reason only
        #[allow(deprecated)]
        MetricType::UNTYPED => sample("", None, metric.get_untyped().get_value()),
        MetricType::SUMMARY => {
            let summary = metric.get_summary();
            for q in summary.get_quantile() {
                sample("", Some(("quantile", q.quantile())), q.value());
            }
            sample("_sum", None, summary.sample_sum());
            sample("_count", None, summary.sample_count() as f64);
        }
        MetricType::HISTOGRAM => {
            let histogram = metric.get_histogram();
            let count = histogram.get_sample_count() as f64;
            let mut inf_seen = false;
            for bucket in histogram.get_bucket() {
                let upper_bound = bucket.upper_bound();
                let cumulative = bucket.cumulative_count() as f64;
                sample("_bucket", Some(("le", upper_bound)), cumulative);
                inf_seen |= upper_bound == f64::INFINITY;
            }
            if !inf_seen {
                sample("_bucket", Some(("le", f64::INFINITY)), count);
            }
            sample("_sum", None, histogram.get_sample_sum());
            sample("_count", None, count);
        }
    }
}

/// One line: `name{labels,extra="number"} value[ timestamp]`.
fn push_sample(
    out: &mut String,
    name: &str,
    suffix: &str,
    metric: &Metric,
    extra_label: Option<(&str, f64)>,
    value: f64,
) {
    out.push_str(name);
    out.push_str(suffix);
    push_labels(out, metric.get_label(), extra_label);
    out.push(' ');
    push_go_float(out, value);
    if metric.timestamp_ms() != 0 {
        let _ = write!(out, " {}", metric.timestamp_ms());
    }
    out.push('\n');
}

fn push_labels(out: &mut String, pairs: &[LabelPair], extra: Option<(&str, f64)>) {
    if pairs.is_empty() && extra.is_none() {
        return;
    }
    let mut separator = '{';
    for pair in pairs {
        out.push(separator);
        out.push_str(pair.name());
        out.push_str("=\"");
        push_escaped(out, pair.value(), true);
        out.push('"');
        separator = ',';
    }
    if let Some((name, value)) = extra {
        out.push(separator);
        out.push_str(name);
        out.push_str("=\"");
        push_go_float(out, value);
        out.push('"');
    }
    out.push('}');
}

/// expfmt's escaping: `\` and newline always, `"` in label values.
fn push_escaped(out: &mut String, text: &str, quote: bool) {
    for c in text.chars() {
        match c {
            '\\' => out.push_str(r"\\"),
            '\n' => out.push_str(r"\n"),
            '"' if quote => out.push_str("\\\""),
            _ => out.push(c),
        }
    }
}

fn push_go_float(out: &mut String, value: f64) {
    match value {
        // writeFloat's shortcuts: -0 is written 0 too
        0.0 => out.push('0'),
        v if v.is_nan() => out.push_str("NaN"),
        f64::INFINITY => out.push_str("+Inf"),
        f64::NEG_INFINITY => out.push_str("-Inf"),
        v => out.push_str(&go_float(v)),
    }
}

/// Go's `strconv.FormatFloat(value, 'g', -1, 64)` for a finite value: the
/// shortest decimal that reads back as `value`, in exponent form
/// (`d[.ddd]e±XX`, at least two exponent digits) when its decimal exponent
/// is below -4 or at least 6 — not 21 as for `%v`: with precision -1,
/// `formatDigits` decides with `eprec = 6`, whatever the digit count — and
/// in plain decimals otherwise.
///
/// Rust's `{:e}` and `{}` give the same shortest digits as Go's (the
/// shortest string that round-trips, the closest one among those); only the
/// layout differs.
pub fn go_float(value: f64) -> String {
    debug_assert!(value.is_finite(), "go_float of {value}");
    let scientific = format!("{value:e}");
    let Some((mantissa, exponent)) = scientific.split_once('e') else {
        return scientific;
    };
    let exponent: i32 = exponent.parse().unwrap_or(0);
    if (-4..6).contains(&exponent) {
        format!("{value}")
    } else {
        let sign = if exponent < 0 { '-' } else { '+' };
        format!("{mantissa}e{sign}{:02}", exponent.unsigned_abs())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus::{
        exponential_buckets, Gauge, Histogram, HistogramOpts, IntCounterVec, Opts, Registry,
    };

    fn line(value: f64) -> String {
        let mut out = String::new();
        push_go_float(&mut out, value);
        out
    }

    /// Sample values as etcd 3.5.16 printed them on /metrics (the values
    /// parsed back from its own text, then written again).
    #[test]
    fn values_print_as_etcd_3_5_16_prints_them() {
        for text in [
            "1.56e+07",               // etcd_debugging_mvcc_total_put_size_in_bytes
            "3.4843136e+07",          // etcd_disk_wal_write_bytes_total
            "2.0680704e+07",          // etcd_mvcc_db_total_size_in_bytes
            "1.575e+07",              // etcd_network_client_grpc_received_bytes_total
            "2.147483648e+09",        // etcd_server_quota_backend_bytes
            "2.3554e-05",             // go_gc_duration_seconds{quantile="0"}
            "9.223372036854776e+18",  // go_gc_gomemlimit_bytes
            "1.7964507055244515e+09", // go_memstats_last_gc_time_seconds
            "3.968813e+06",           // go_memstats_frees_total
            "7.9985280149e+10",       // process_network_receive_bytes_total
            "1.79645069771e+09",      // process_start_time_seconds
            "1.8446744073709552e+19", // process_virtual_memory_max_bytes
            "0.015458930000000003",   // ..._spill_duration_seconds_sum
            "0.23100600699999996",    // ..._write_duration_seconds_sum
            "62",                     // ..._duration_seconds_count
            "999999",
            "0.0001",
            "1e-05",
            "1e+06",
            "-1.5e+07",
            "-0.25",
        ] {
            let value: f64 = text.parse().expect("a number");
            assert_eq!(line(value), text, "{value:?}");
        }
        assert_eq!(line(0.0), "0");
        assert_eq!(line(-0.0), "0");
        assert_eq!(line(1.0), "1");
        assert_eq!(line(-1.0), "-1");
        assert_eq!(line(f64::NAN), "NaN");
        assert_eq!(line(f64::INFINITY), "+Inf");
        assert_eq!(line(f64::NEG_INFINITY), "-Inf");
        assert_eq!(line(1e100), "1e+100");
        assert_eq!(line(5e-324), "5e-324");
        assert_eq!(line(123456.5), "123456.5");
        assert_eq!(line(1234567.5), "1.2345675e+06");
    }

    /// Any finite value reads back exactly; the layout follows the decimal
    /// exponent (checked away from the thresholds, where log10 may be off).
    fn check_go_float(value: f64) -> Result<(), proptest::test_runner::TestCaseError> {
        let text = go_float(value);
        proptest::prop_assert_eq!(text.parse::<f64>().ok(), Some(value), "{}", text);
        let magnitude = value.abs();
        if (1e-3..1e5).contains(&magnitude) {
            proptest::prop_assert!(!text.contains('e'), "{}", text);
        }
        if magnitude >= 1e7 || (magnitude > 0.0 && magnitude < 1e-5) {
            proptest::prop_assert!(text.contains('e'), "{}", text);
        }
        Ok(())
    }

    proptest::proptest! {
        #[test]
        fn go_float_of_any_bits(bits: u64) {
            let value = f64::from_bits(bits);
            proptest::prop_assume!(value.is_finite());
            check_go_float(value)?;
        }

        #[test]
        fn go_float_of_metric_sized_values(value in -1e12f64..1e12, scale in -12i32..12) {
            check_go_float(value * 10f64.powi(scale))?;
        }
    }

    /// A histogram with etcd's lease TTL buckets (1 s doubling 20 times) and
    /// a counter: the lines etcd 3.5.16 writes for them.
    #[test]
    fn histogram_buckets_and_counts_as_etcd_writes_them() {
        let registry = Registry::new();
        let buckets = exponential_buckets(1.0, 2.0, 24).expect("valid buckets");
        let ttl = Histogram::with_opts(
            HistogramOpts::new(
                "etcd_debugging_lease_ttl_total",
                "Bucketed histogram of lease TTLs.",
            )
            .buckets(buckets),
        )
        .expect("valid metric");
        registry
            .register(Box::new(ttl.clone()))
            .expect("registered");
        ttl.observe(3_000_000.0);
        let size = Gauge::new(
            "etcd_mvcc_db_total_size_in_bytes",
            "Total size of the underlying database physically allocated in bytes.",
        )
        .expect("valid metric");
        registry
            .register(Box::new(size.clone()))
            .expect("registered");
        size.set(20_680_704.0);
        let received = IntCounterVec::new(
            Opts::new(
                "etcd_network_peer_received_bytes_total",
                "The total number of bytes received from peers.",
            ),
            &["From"],
        )
        .expect("valid metric");
        registry
            .register(Box::new(received.clone()))
            .expect("registered");
        received
            .with_label_values(&["8e9e05c52164694d"])
            .inc_by(1_234_500);
        let text = encode(&registry.gather());
        for expected in [
            "# HELP etcd_debugging_lease_ttl_total Bucketed histogram of lease TTLs.\n\
             # TYPE etcd_debugging_lease_ttl_total histogram\n\
             etcd_debugging_lease_ttl_total_bucket{le=\"1\"} 0\n\
             etcd_debugging_lease_ttl_total_bucket{le=\"2\"} 0\n",
            "etcd_debugging_lease_ttl_total_bucket{le=\"524288\"} 0\n\
             etcd_debugging_lease_ttl_total_bucket{le=\"1.048576e+06\"} 0\n\
             etcd_debugging_lease_ttl_total_bucket{le=\"2.097152e+06\"} 0\n\
             etcd_debugging_lease_ttl_total_bucket{le=\"4.194304e+06\"} 1\n\
             etcd_debugging_lease_ttl_total_bucket{le=\"8.388608e+06\"} 1\n\
             etcd_debugging_lease_ttl_total_bucket{le=\"+Inf\"} 1\n\
             etcd_debugging_lease_ttl_total_sum 3e+06\n\
             etcd_debugging_lease_ttl_total_count 1\n",
            "# TYPE etcd_mvcc_db_total_size_in_bytes gauge\n\
             etcd_mvcc_db_total_size_in_bytes 2.0680704e+07\n",
            "# TYPE etcd_network_peer_received_bytes_total counter\n\
             etcd_network_peer_received_bytes_total{From=\"8e9e05c52164694d\"} 1.2345e+06\n",
        ] {
            assert!(text.contains(expected), "no\n{expected}in\n{text}");
        }
    }

    #[test]
    fn help_and_label_values_are_escaped_as_expfmt_escapes_them() {
        let registry = Registry::new();
        let failures = IntCounterVec::new(
            Opts::new(
                "etcd_server_learner_promote_failures",
                "line one\nback\\slash \"quoted\"",
            ),
            &["Reason"],
        )
        .expect("valid metric");
        registry
            .register(Box::new(failures.clone()))
            .expect("registered");
        failures.with_label_values(&["a \"b\"\nc\\d"]).inc();
        // registered but never given a label set: no metric, no lines
        let empty = IntCounterVec::new(Opts::new("etcd_unused_total", "Unused."), &["x"])
            .expect("valid metric");
        registry.register(Box::new(empty)).expect("registered");
        assert_eq!(
            encode(&registry.gather()),
            "# HELP etcd_server_learner_promote_failures line one\\nback\\\\slash \"quoted\"\n\
             # TYPE etcd_server_learner_promote_failures counter\n\
             etcd_server_learner_promote_failures{Reason=\"a \\\"b\\\"\\nc\\\\d\"} 1\n"
        );
    }
}
