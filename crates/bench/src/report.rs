//! Latency statistics and their rendering, as etcd's `pkg/report` prints them.
//!
//! The text layout (labels, tabs, `%4.4f` or `%g` numbers, the 10-bucket
//! histogram of `∎` bars, the percentile walk) is etcd's, so that a figure
//! from oxbench can be put beside one from etcd's own `benchmark` tool.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

use crate::gofmt;

const BAR_CHAR: &str = "∎";
/// etcd's histogram has this many buckets between fastest and slowest, plus one for the slowest.
const HISTOGRAM_BUCKETS: usize = 10;
/// Longest bar, in `∎`, of the most populated bucket.
const HISTOGRAM_BAR_WIDTH: usize = 40;

/// The percentiles etcd reports, with the labels its `%v` prints for them.
pub const PERCENTILES: [(f64, &str); 8] = [
    (10.0, "10"),
    (25.0, "25"),
    (50.0, "50"),
    (75.0, "75"),
    (90.0, "90"),
    (95.0, "95"),
    (99.0, "99"),
    (99.9, "99.9"),
];

/// How numbers are printed: etcd's default `%4.4f`, or `%g` under `--precise`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Precision {
    Fixed4,
    Shortest,
}

impl Precision {
    pub fn format(self, value: f64) -> String {
        match self {
            Precision::Fixed4 => format!("{value:.4}"),
            Precision::Shortest => gofmt::shortest_g(value),
        }
    }

    fn secs(self, value: f64) -> String {
        format!("{} secs", self.format(value))
    }
}

/// Results gathered by one client task; merged into one [`Stats`] at the end.
/// Each task owns its recorder so that the hot path takes no lock.
#[derive(Default, Debug)]
pub struct Recorder {
    latencies: Vec<f64>,
    errors: HashMap<String, u64>,
}

impl Recorder {
    pub fn with_capacity(capacity: usize) -> Self {
        Recorder {
            latencies: Vec::with_capacity(capacity),
            errors: HashMap::new(),
        }
    }

    pub fn record(&mut self, start: Instant, end: Instant, result: Result<(), String>) {
        match result {
            Ok(()) => self.success(end.saturating_duration_since(start)),
            Err(message) => self.error(message),
        }
    }

    pub fn success(&mut self, latency: Duration) {
        self.latencies.push(latency.as_secs_f64());
    }

    pub fn error(&mut self, message: String) {
        *self.errors.entry(message).or_insert(0) += 1;
    }

    pub fn errors_n(&mut self, message: &str, count: u64) {
        if count > 0 {
            *self.errors.entry(message.to_string()).or_insert(0) += count;
        }
    }

    pub fn merge(&mut self, other: Recorder) {
        self.latencies.extend(other.latencies);
        for (message, count) in other.errors {
            *self.errors.entry(message).or_insert(0) += count;
        }
    }

    pub fn finish(self, total: Duration) -> Stats {
        Stats::compute(self.latencies, self.errors, total)
    }
}

/// One benchmark's summary, computed as etcd's `processResults` does.
#[derive(Clone, Debug, PartialEq)]
pub struct Stats {
    pub total: Duration,
    pub fastest: f64,
    pub slowest: f64,
    pub average: f64,
    pub stddev: f64,
    pub rps: f64,
    /// Successful latencies in seconds, sorted ascending.
    pub latencies: Vec<f64>,
    /// Distinct error messages with their counts, most frequent first.
    pub errors: Vec<(String, u64)>,
}

impl Stats {
    pub fn compute(
        mut latencies: Vec<f64>,
        errors: HashMap<String, u64>,
        total: Duration,
    ) -> Stats {
        let n = latencies.len() as f64;
        let average = latencies.iter().sum::<f64>() / n;
        let variance = latencies
            .iter()
            .map(|l| (l - average) * (l - average))
            .sum::<f64>()
            / n;
        latencies.sort_by(f64::total_cmp);
        let mut errors: Vec<(String, u64)> = errors.into_iter().collect();
        errors.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        Stats {
            total,
            fastest: latencies.first().copied().unwrap_or(0.0),
            slowest: latencies.last().copied().unwrap_or(0.0),
            average,
            stddev: variance.sqrt(),
            rps: n / total.as_secs_f64(),
            latencies,
            errors,
        }
    }

    pub fn error_count(&self) -> u64 {
        self.errors.iter().map(|(_, count)| count).sum()
    }

    /// etcd's `Percentiles`: walk the sorted latencies and take the first whose
    /// rank (i*100/n) reaches each percentile; a percentile never reached is 0.
    pub fn percentiles(&self) -> [f64; PERCENTILES.len()] {
        percentiles(&self.latencies)
    }

    /// The report text, byte for byte as etcd's `report.String()`.
    pub fn render(&self, precision: Precision) -> String {
        let mut out = String::new();
        if !self.latencies.is_empty() {
            let p = precision;
            out.push_str("\nSummary:\n");
            let _ = writeln!(out, "  Total:\t{}.", p.secs(self.total.as_secs_f64()));
            let _ = writeln!(out, "  Slowest:\t{}.", p.secs(self.slowest));
            let _ = writeln!(out, "  Fastest:\t{}.", p.secs(self.fastest));
            let _ = writeln!(out, "  Average:\t{}.", p.secs(self.average));
            let _ = writeln!(out, "  Stddev:\t{}.", p.secs(self.stddev));
            let _ = writeln!(out, "  Requests/sec:\t{}", p.format(self.rps));
            out.push_str(&self.histogram(p));
            out.push_str(&self.latency_distribution(p));
        }
        if !self.errors.is_empty() {
            out.push_str("\nError distribution:\n");
            for (message, count) in &self.errors {
                let _ = writeln!(out, "  [{count}]\t{message}");
            }
        }
        out
    }

    fn histogram(&self, precision: Precision) -> String {
        let mut buckets = [0.0; HISTOGRAM_BUCKETS + 1];
        let mut counts = [0usize; HISTOGRAM_BUCKETS + 1];
        let width = (self.slowest - self.fastest) / HISTOGRAM_BUCKETS as f64;
        for (i, bucket) in buckets.iter_mut().enumerate().take(HISTOGRAM_BUCKETS) {
            *bucket = self.fastest + width * i as f64;
        }
        buckets[HISTOGRAM_BUCKETS] = self.slowest;
        // Same walk as etcd: each latency goes to the first bucket bound not below it.
        let mut bucket = 0;
        let mut max = 0;
        let mut i = 0;
        while i < self.latencies.len() {
            if self.latencies[i] <= buckets[bucket] {
                i += 1;
                counts[bucket] += 1;
                max = max.max(counts[bucket]);
            } else if bucket < buckets.len() - 1 {
                bucket += 1;
            } else {
                // Unreachable for sorted input (the last bound is the slowest); guards NaN.
                break;
            }
        }
        let mut out = String::from("\nResponse time histogram:\n");
        for (bound, count) in buckets.iter().zip(counts) {
            let bar = (count * HISTOGRAM_BAR_WIDTH).checked_div(max).unwrap_or(0);
            let _ = writeln!(
                out,
                "  {} [{count}]\t|{}",
                precision.format(*bound),
                BAR_CHAR.repeat(bar)
            );
        }
        out
    }

    fn latency_distribution(&self, precision: Precision) -> String {
        let mut out = String::from("\nLatency distribution:\n");
        for ((_, label), value) in PERCENTILES.iter().zip(self.percentiles()) {
            if value > 0.0 {
                let _ = writeln!(out, "  {label}% in {}.", precision.secs(value));
            }
        }
        out
    }

    /// The summary as one JSON object, for scripts (`--json`).
    pub fn to_json(&self) -> serde_json::Value {
        let pcts = self.percentiles();
        let finite = |v: f64| if v.is_finite() { v } else { 0.0 };
        serde_json::json!({
            "total_secs": self.total.as_secs_f64(),
            "slowest": self.slowest,
            "fastest": self.fastest,
            "average": finite(self.average),
            "stddev": finite(self.stddev),
            "rps": finite(self.rps),
            "p50": pcts[2],
            "p90": pcts[4],
            "p99": pcts[6],
            "p999": pcts[7],
            "errors": self.error_count(),
            "requests": self.latencies.len(),
            "error_distribution": self.errors.iter()
                .map(|(m, c)| serde_json::json!({"count": c, "error": m}))
                .collect::<Vec<_>>(),
        })
    }
}

/// etcd's percentile walk over sorted latencies (see [`Stats::percentiles`]).
pub fn percentiles(sorted: &[f64]) -> [f64; PERCENTILES.len()] {
    let mut data = [0.0; PERCENTILES.len()];
    let n = sorted.len();
    let mut j = 0;
    for (i, latency) in sorted.iter().enumerate() {
        if j >= PERCENTILES.len() {
            break;
        }
        let rank = i as f64 * 100.0 / n as f64;
        if rank >= PERCENTILES[j].0 {
            data[j] = *latency;
            j += 1;
        }
    }
    data
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats_of(latencies: &[f64], errors: &[(&str, u64)], total: f64) -> Stats {
        let errors = errors.iter().map(|(m, c)| (m.to_string(), *c)).collect();
        Stats::compute(latencies.to_vec(), errors, Duration::from_secs_f64(total))
    }

    // etcd's TestPercentiles: 1 slow request out of 100 is the 99th percentile,
    // 1 out of 1000 is the 99.9th.
    #[test]
    fn percentiles_match_etcd_rank_walk() {
        let mut nums = vec![0.0; 100];
        nums[99] = 1.0;
        assert_eq!(percentiles(&nums)[6], 1.0);
        let mut nums = vec![0.0; 1000];
        nums[999] = 1.0;
        assert_eq!(percentiles(&nums)[7], 1.0);
    }

    #[test]
    fn percentiles_of_one_to_ten() {
        let nums: Vec<f64> = (1..=10).map(f64::from).collect();
        // ranks are 0,10,20,...,90: p10 is the 2nd value, p75 the 9th, p95 and up never reached.
        assert_eq!(
            percentiles(&nums),
            [2.0, 4.0, 6.0, 9.0, 10.0, 0.0, 0.0, 0.0]
        );
    }

    // etcd's TestReport: five 1-second results and one error.
    #[test]
    fn stats_of_equal_latencies_and_one_error() {
        let s = stats_of(&[1.0; 5], &[("oops", 1)], 10.0);
        assert_eq!(s.fastest, 1.0);
        assert_eq!(s.slowest, 1.0);
        assert_eq!(s.average, 1.0);
        assert_eq!(s.stddev, 0.0);
        assert_eq!(s.rps, 0.5);
        assert_eq!(s.error_count(), 1);
        let text = s.render(Precision::Fixed4);
        for want in [
            "Stddev:\t0",
            "Average:\t1.0",
            "Slowest:\t1.0",
            "Fastest:\t1.0",
        ] {
            assert!(text.contains(want), "missing {want:?} in {text}");
        }
    }

    #[test]
    fn report_text_matches_etcd_layout() {
        let lats: Vec<f64> = (1..=10).map(|i| f64::from(i) / 1000.0).collect();
        let s = stats_of(&lats, &[("etcdserver: request timed out", 2)], 0.5);
        let want = "\nSummary:\n\
            \x20 Total:\t0.5000 secs.\n\
            \x20 Slowest:\t0.0100 secs.\n\
            \x20 Fastest:\t0.0010 secs.\n\
            \x20 Average:\t0.0055 secs.\n\
            \x20 Stddev:\t0.0029 secs.\n\
            \x20 Requests/sec:\t20.0000\n\
            \nResponse time histogram:\n\
            \x20 0.0010 [1]\t|∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎\n\
            \x20 0.0019 [0]\t|\n\
            \x20 0.0028 [1]\t|∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎\n\
            \x20 0.0037 [1]\t|∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎\n\
            \x20 0.0046 [1]\t|∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎\n\
            \x20 0.0055 [1]\t|∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎\n\
            \x20 0.0064 [1]\t|∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎\n\
            \x20 0.0073 [1]\t|∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎\n\
            \x20 0.0082 [1]\t|∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎\n\
            \x20 0.0091 [1]\t|∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎\n\
            \x20 0.0100 [1]\t|∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎∎\n\
            \nLatency distribution:\n\
            \x20 10% in 0.0020 secs.\n\
            \x20 25% in 0.0040 secs.\n\
            \x20 50% in 0.0060 secs.\n\
            \x20 75% in 0.0090 secs.\n\
            \x20 90% in 0.0100 secs.\n\
            \nError distribution:\n\
            \x20 [2]\tetcdserver: request timed out\n";
        assert_eq!(s.render(Precision::Fixed4), want);
    }

    #[test]
    fn histogram_bars_scale_to_the_fullest_bucket() {
        let s = stats_of(&[0.001, 0.001, 0.001, 0.001, 0.002], &[], 1.0);
        let text = s.render(Precision::Fixed4);
        assert!(text.contains(&format!("  0.0010 [4]\t|{}\n", "∎".repeat(40))));
        assert!(text.contains(&format!("  0.0020 [1]\t|{}\n", "∎".repeat(10))));
    }

    #[test]
    fn precise_uses_go_shortest_g() {
        let s = stats_of(&[0.00012, 0.5], &[], 2.0);
        let text = s.render(Precision::Shortest);
        assert!(text.contains("  Total:\t2 secs.\n"), "{text}");
        assert!(text.contains("  Fastest:\t0.00012 secs.\n"), "{text}");
        assert!(text.contains("  Requests/sec:\t1\n"), "{text}");
    }

    #[test]
    fn only_errors_prints_only_the_error_distribution() {
        let s = stats_of(&[], &[("rpc error: code = Unimplemented desc = x", 3)], 1.0);
        assert_eq!(
            s.render(Precision::Fixed4),
            "\nError distribution:\n  [3]\trpc error: code = Unimplemented desc = x\n"
        );
        let json = s.to_json();
        assert_eq!(json["errors"], 3);
        assert_eq!(json["requests"], 0);
        assert_eq!(json["rps"], 0.0);
    }

    #[test]
    fn json_carries_the_summary_fields() {
        let lats: Vec<f64> = (1..=1000).map(|i| f64::from(i) / 1000.0).collect();
        let json = stats_of(&lats, &[], 4.0).to_json();
        assert_eq!(json["requests"], 1000);
        assert_eq!(json["rps"], 250.0);
        assert_eq!(json["p50"], 0.501);
        assert_eq!(json["p99"], 0.991);
        assert_eq!(json["p999"], 1.0);
        assert_eq!(json["slowest"], 1.0);
    }
}
