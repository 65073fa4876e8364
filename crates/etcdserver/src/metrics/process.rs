//! What etcd exposes of the process beyond the prometheus crate's process
//! collector (which gives process_cpu_seconds_total, process_open_fds,
//! process_max_fds, process_{virtual,resident}_memory_bytes,
//! process_start_time_seconds and process_threads): etcd's os_fd_used and
//! os_fd_limit (pkg/runtime: /proc/self/fd entries and RLIMIT_NOFILE's soft
//! limit) and client_golang's process_virtual_memory_max_bytes
//! (RLIMIT_AS) and process_network_{receive,transmit}_bytes_total (every
//! interface of /proc/self/net/dev: the network namespace's traffic, as Go
//! reports it). Read at scrape time.

use prometheus::{Gauge, IntCounter, IntGauge, Registry};

use super::{counter, gauge};
use crate::metrics::store::advance;

pub(crate) struct ProcessMetrics {
    fd_used: IntGauge,
    fd_limit: IntGauge,
    virtual_memory_max: Gauge,
    network_received: IntCounter,
    network_sent: IntCounter,
}

impl ProcessMetrics {
    pub(super) fn new(r: &Registry) -> ProcessMetrics {
        let virtual_memory_max = Gauge::new(
            "process_virtual_memory_max_bytes",
            "Maximum amount of virtual memory available in bytes.",
        )
        .expect("valid metric");
        r.register(Box::new(virtual_memory_max.clone()))
            .expect("metric registered once");
        ProcessMetrics {
            fd_used: gauge(r, "os_fd_used", "The number of used file descriptors."),
            fd_limit: gauge(r, "os_fd_limit", "The file descriptor limit."),
            virtual_memory_max,
            network_received: counter(
                r,
                "process_network_receive_bytes_total",
                "Number of bytes received by the process over the network.",
            ),
            network_sent: counter(
                r,
                "process_network_transmit_bytes_total",
                "Number of bytes sent by the process over the network.",
            ),
        }
    }

    pub(super) fn refresh(&self) {
        if let Some(used) = fd_used() {
            self.fd_used.set(used as i64);
        }
        if let Some(limit) = soft_limit(libc::RLIMIT_NOFILE) {
            self.fd_limit.set(limit.min(i64::MAX as u64) as i64);
        }
        if let Some(limit) = soft_limit(libc::RLIMIT_AS) {
            // Go reports an unlimited RLIMIT_AS as 2^64-1 too.
            self.virtual_memory_max.set(limit as f64);
        }
        if let Ok(dev) = std::fs::read_to_string("/proc/self/net/dev") {
            let (received, sent) = network_totals(&dev);
            advance(&self.network_received, received);
            advance(&self.network_sent, sent);
        }
    }
}

/// Open file descriptors: the entries of /proc/self/fd (the one reading
/// them included, as etcd's count includes its own).
pub fn fd_used() -> Option<usize> {
    Some(std::fs::read_dir("/proc/self/fd").ok()?.count())
}

/// A getrlimit resource.
pub type Resource = libc::__rlimit_resource_t;
/// RLIMIT_NOFILE, for callers without libc.
pub const NOFILE: Resource = libc::RLIMIT_NOFILE;

/// A resource's soft limit (RLIM_INFINITY is u64::MAX).
pub fn soft_limit(resource: Resource) -> Option<u64> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit only writes the struct we pass.
    let rc = unsafe { libc::getrlimit(resource, &mut limit) };
    (rc == 0).then_some(limit.rlim_cur)
}

/// Received and transmitted bytes over every interface of a
/// /proc/net/dev table.
fn network_totals(dev: &str) -> (u64, u64) {
    let mut totals = (0u64, 0u64);
    // two header lines, then "iface: rx_bytes packets ... tx_bytes ..."
    for line in dev.lines().skip(2) {
        let Some((_, counters)) = line.split_once(':') else {
            continue;
        };
        let fields: Vec<u64> = counters
            .split_whitespace()
            .map(|f| f.parse().unwrap_or(0))
            .collect();
        if fields.len() >= 9 {
            totals.0 = totals.0.saturating_add(fields[0]);
            totals.1 = totals.1.saturating_add(fields[8]);
        }
    }
    totals
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn network_totals_sum_every_interface_of_proc_net_dev() {
        let dev = "Inter-|   Receive                                                |  Transmit\n face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed\n    lo:  1000      10    0    0    0     0          0         0     1000      10    0    0    0     0       0          0\n  eth0:  2500      20    0    0    0     0          0         0      700       7    0    0    0     0       0          0\n";
        assert_eq!(network_totals(dev), (3500, 1700));
    }

    #[test]
    fn fd_usage_and_limit_are_read() {
        assert!(fd_used().is_some_and(|n| n > 0));
        assert!(soft_limit(libc::RLIMIT_NOFILE).is_some_and(|n| n > 0));
    }
}
