//! `/debug/pprof/` on client URLs, served only with `--enable-pprof` (or
//! `--log-level=debug`, as etcd; the binary sets
//! `ServerConfig::enable_pprof` for both); without it these paths are 404
//! like any unknown path, as etcd 3.5.16 answers.
//!
//! - `profile?seconds=N` (default 30, as Go): a CPU profile sampled at
//!   100 Hz (the `pprof` crate: SIGPROF and a stack walk per sample) for N
//!   seconds, as Go's gzip'd pprof protobuf: `go tool pprof` reads it. One
//!   at a time (Go's "cpu profiling already in use" for a second).
//! - `heap`: a text summary, not Go's allocation profile: nothing records
//!   allocation sites here. It has the process's memory from
//!   /proc/self/status (resident, anonymous, data, peak, swap), its
//!   threads and open file descriptors.
//! - `cmdline`: the arguments, NUL-separated (Go's).
//! - the index lists these. Go's goroutine, threadcreate, block, mutex,
//!   allocs, symbol and trace have no equivalent: 404 "Unknown profile"
//!   (Go's answer for a profile it does not have).

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::body::Body;
use http::{header, HeaderValue, Method, StatusCode};

use crate::{method_not_allowed, plain_error};

/// Go's default profile length.
const DEFAULT_SECONDS: u64 = 30;
/// A profile holds a blocking thread for its length: at most an hour.
const MAX_SECONDS: u64 = 3600;
/// Samples per second (Go's runtime/pprof rate).
const SAMPLE_HZ: i32 = 100;

/// The profiler is process-wide (one SIGPROF timer).
static PROFILING: AtomicBool = AtomicBool::new(false);

/// The routes, to merge into the client router when pprof is enabled.
pub fn router() -> axum::Router {
    axum::Router::new()
        .route("/debug/pprof", axum::routing::any(index))
        .route("/debug/pprof/", axum::routing::any(index))
        .route("/debug/pprof/{name}", axum::routing::any(named))
}

fn with_type(body: impl Into<Body>, content_type: &'static str) -> http::Response<Body> {
    let mut response = http::Response::new(body.into());
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    response.headers_mut().insert(
        "x-content-type-options",
        HeaderValue::from_static("nosniff"),
    );
    response
}

async fn index(request: http::Request<Body>) -> http::Response<Body> {
    if request.method() != Method::GET {
        return method_not_allowed(Some("GET"));
    }
    let page = "<html>\n<head>\n<title>/debug/pprof/</title>\n</head>\n<body>\n/debug/pprof/<br>\n<br>\nProfiles:<br>\n<ul>\n\
<li><a href=\"cmdline\">cmdline</a>: the command line</li>\n\
<li><a href=\"heap\">heap</a>: a summary of the process's memory (no allocation sites)</li>\n\
<li><a href=\"profile\">profile</a>: CPU profile; ?seconds=N (default 30), gzip'd pprof protobuf</li>\n\
</ul>\n</body>\n</html>\n";
    with_type(page, "text/html; charset=utf-8")
}

async fn named(
    axum::extract::Path(name): axum::extract::Path<String>,
    request: http::Request<Body>,
) -> http::Response<Body> {
    if request.method() != Method::GET {
        return method_not_allowed(Some("GET"));
    }
    match name.as_str() {
        "profile" => profile(request.uri().query().unwrap_or("")).await,
        "heap" => with_type(heap_summary(), "text/plain; charset=utf-8"),
        "cmdline" => with_type(
            std::env::args().collect::<Vec<_>>().join("\0"),
            "text/plain; charset=utf-8",
        ),
        _ => plain_error(StatusCode::NOT_FOUND, "Unknown profile"),
    }
}

/// `seconds` from the query; Go takes a missing, bad or non-positive value
/// as the default.
fn seconds(query: &str) -> u64 {
    query
        .split('&')
        .find_map(|pair| pair.strip_prefix("seconds="))
        .and_then(|v| v.parse::<i64>().ok())
        .filter(|s| *s > 0)
        .map_or(DEFAULT_SECONDS, |s| s as u64)
}

async fn profile(query: &str) -> http::Response<Body> {
    let seconds = seconds(query);
    if seconds > MAX_SECONDS {
        return plain_error(
            StatusCode::BAD_REQUEST,
            "profile duration exceeds server's WriteTimeout",
        );
    }
    if PROFILING.swap(true, Ordering::AcqRel) {
        return plain_error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "Could not enable CPU profiling: cpu profiling already in use",
        );
    }
    let result =
        tokio::task::spawn_blocking(move || cpu_profile(Duration::from_secs(seconds))).await;
    PROFILING.store(false, Ordering::Release);
    match result {
        Ok(Ok(gzipped)) => {
            let mut response = with_type(gzipped, "application/octet-stream");
            response.headers_mut().insert(
                header::CONTENT_DISPOSITION,
                HeaderValue::from_static("attachment; filename=\"profile\""),
            );
            response
        }
        Ok(Err(e)) => plain_error(
            StatusCode::INTERNAL_SERVER_ERROR,
            &format!("Could not enable CPU profiling: {e}"),
        ),
        Err(e) => plain_error(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
    }
}

/// Samples every thread for `length`, then the gzip'd pprof protobuf.
fn cpu_profile(length: Duration) -> Result<Vec<u8>, String> {
    use pprof::protos::Message;
    let guard = pprof::ProfilerGuardBuilder::default()
        .frequency(SAMPLE_HZ)
        // unwinding through these from a signal handler can deadlock
        .blocklist(&["libc", "libgcc", "pthread", "vdso"])
        .build()
        .map_err(|e| e.to_string())?;
    std::thread::sleep(length);
    let profile = guard
        .report()
        .build()
        .and_then(|report| report.pprof())
        .map_err(|e| e.to_string())?;
    drop(guard);
    let mut encoded = Vec::with_capacity(profile.encoded_len());
    profile.encode(&mut encoded).map_err(|e| e.to_string())?;
    let mut gzip = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gzip.write_all(&encoded).map_err(|e| e.to_string())?;
    gzip.finish().map_err(|e| e.to_string())
}

/// The memory lines of /proc/self/status, threads and open descriptors.
fn heap_summary() -> String {
    const FIELDS: &[&str] = &[
        "VmPeak", "VmSize", "VmHWM", "VmRSS", "RssAnon", "RssFile", "RssShmem", "VmData", "VmStk",
        "VmSwap", "Threads",
    ];
    let mut out = String::from(
        "# oxcd heap summary: the process's memory as the kernel counts it (no\n\
         # allocation sites: Go's heap profile has no equivalent here)\n",
    );
    if let Ok(status) = std::fs::read_to_string("/proc/self/status") {
        for line in status.lines() {
            if let Some((key, value)) = line.split_once(':') {
                if FIELDS.contains(&key) {
                    out.push_str(&format!("{key}: {}\n", value.trim()));
                }
            }
        }
    }
    if let Some(fds) = etcdserver::metrics::process::fd_used() {
        out.push_str(&format!("OpenFDs: {fds}\n"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_default_as_go_does() {
        assert_eq!(seconds(""), 30);
        assert_eq!(seconds("seconds=2"), 2);
        assert_eq!(seconds("debug=1&seconds=5"), 5);
        assert_eq!(seconds("seconds=0"), 30);
        assert_eq!(seconds("seconds=-3"), 30);
        assert_eq!(seconds("seconds=x"), 30);
    }

    #[test]
    fn a_cpu_profile_is_gzipped_pprof_protobuf() {
        use pprof::protos::Message;
        use std::io::Read;
        let gzipped = cpu_profile(Duration::from_millis(300)).unwrap();
        assert_eq!(&gzipped[..2], &[0x1f, 0x8b]);
        let mut raw = Vec::new();
        flate2::read::GzDecoder::new(&gzipped[..])
            .read_to_end(&mut raw)
            .unwrap();
        let profile = pprof::protos::Profile::decode(&raw[..]).unwrap();
        assert!(!profile.sample_type.is_empty());
        assert_eq!(profile.period, 1_000_000_000 / i64::from(SAMPLE_HZ));
    }
}
