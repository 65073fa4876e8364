//! `/etc/resolv.conf` and `/etc/hosts` as Go's resolver reads them
//! (net/dnsconfig.go, net/hosts.go).

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::Path;
use std::time::Duration;

/// resolv.conf's limit (MAXNS), which Go keeps.
pub const MAX_NAMESERVERS: usize = 3;
/// Go's clamp on `options ndots:`.
const MAX_NDOTS: usize = 15;

/// `/etc/resolv.conf` as Go understands it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResolvConf {
    pub servers: Vec<SocketAddr>,
    /// Rooted suffixes.
    pub search: Vec<String>,
    pub ndots: usize,
    pub timeout: Duration,
    pub attempts: usize,
    pub rotate: bool,
    pub use_tcp: bool,
}

impl ResolvConf {
    /// Go's defaults for a system without a resolv.conf.
    pub fn defaults(hostname: &str) -> ResolvConf {
        ResolvConf {
            servers: default_servers(),
            search: default_search(hostname),
            ndots: 1,
            timeout: Duration::from_secs(5),
            attempts: 2,
            rotate: false,
            use_tcp: false,
        }
    }

    /// The file at `path`, or Go's defaults when it cannot be read.
    pub fn read(path: &Path) -> ResolvConf {
        let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
        match std::fs::read_to_string(path) {
            Ok(text) => ResolvConf::parse(&text, hostname.trim()),
            Err(_) => ResolvConf::defaults(hostname.trim()),
        }
    }

    /// Go's `parseResolvConf`; `hostname` gives the search domain when the
    /// file names none.
    pub fn parse(text: &str, hostname: &str) -> ResolvConf {
        let mut conf = ResolvConf {
            servers: Vec::new(),
            search: Vec::new(),
            ..ResolvConf::defaults(hostname)
        };
        for line in text.lines() {
            if line.starts_with(';') || line.starts_with('#') {
                continue;
            }
            let fields: Vec<&str> = line.split_ascii_whitespace().collect();
            match fields.as_slice() {
                ["nameserver", server, ..] if conf.servers.len() < MAX_NAMESERVERS => {
                    if let Ok(ip) = server.parse::<IpAddr>() {
                        conf.servers.push(SocketAddr::new(ip, 53));
                    }
                }
                ["domain", domain, ..] => conf.search = vec![rooted(domain)],
                ["search", domains @ ..] => {
                    conf.search = domains
                        .iter()
                        .map(|d| rooted(d))
                        .filter(|d| d != ".")
                        .collect();
                }
                ["options", options @ ..] => {
                    for option in options {
                        if let Some(n) = option.strip_prefix("ndots:") {
                            conf.ndots = go_dtoi(n).clamp(0, MAX_NDOTS as i64) as usize;
                        } else if let Some(n) = option.strip_prefix("timeout:") {
                            conf.timeout = Duration::from_secs(go_dtoi(n).max(1) as u64);
                        } else if let Some(n) = option.strip_prefix("attempts:") {
                            conf.attempts = go_dtoi(n).max(1) as usize;
                        } else if *option == "rotate" {
                            conf.rotate = true;
                        } else if ["use-vc", "usevc", "tcp"].contains(option) {
                            conf.use_tcp = true;
                        }
                    }
                }
                _ => {}
            }
        }
        if conf.servers.is_empty() {
            conf.servers = default_servers();
        }
        if conf.search.is_empty() {
            conf.search = default_search(hostname);
        }
        conf
    }

    /// Go's `nameList`: the rooted names to try for `name`, in order.
    pub fn name_list(&self, name: &str) -> Vec<String> {
        let rooted_name = name.ends_with('.');
        if name.len() > 254 || name.len() == 254 && !rooted_name {
            return Vec::new();
        }
        if rooted_name {
            return if avoid_dns(name) {
                Vec::new()
            } else {
                vec![name.to_string()]
            };
        }
        let has_ndots = name.matches('.').count() >= self.ndots;
        let name = format!("{name}.");
        let mut names = Vec::with_capacity(1 + self.search.len());
        if has_ndots && !avoid_dns(&name) {
            names.push(name.clone());
        }
        for suffix in &self.search {
            let fqdn = format!("{name}{suffix}");
            if !avoid_dns(&fqdn) && fqdn.len() <= 254 {
                names.push(fqdn);
            }
        }
        if !has_ndots && !avoid_dns(&name) {
            names.push(name);
        }
        names
    }
}

pub(super) fn default_servers() -> Vec<SocketAddr> {
    vec![
        SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 53),
        SocketAddr::new(IpAddr::V6(Ipv6Addr::LOCALHOST), 53),
    ]
}

/// Go's `dnsDefaultSearch`: the host name's domain, if it has one.
fn default_search(hostname: &str) -> Vec<String> {
    match hostname.find('.') {
        Some(i) if i < hostname.len() - 1 => vec![rooted(&hostname[i + 1..])],
        _ => Vec::new(),
    }
}

fn rooted(name: &str) -> String {
    if name.ends_with('.') {
        name.to_string()
    } else {
        format!("{name}.")
    }
}

/// Go's `avoidDNS`: `.onion` names are never asked (RFC 7686).
fn avoid_dns(name: &str) -> bool {
    if name.is_empty() {
        return true;
    }
    let name = name.strip_suffix('.').unwrap_or(name).as_bytes();
    name.len() >= 6 && name[name.len() - 6..].eq_ignore_ascii_case(b".onion")
}

/// Go's `dtoi`: the leading decimal digits (0 without any), saturating.
fn go_dtoi(text: &str) -> i64 {
    let digits: String = text.chars().take_while(char::is_ascii_digit).collect();
    if digits.is_empty() {
        return 0;
    }
    digits.parse().unwrap_or(i64::MAX)
}

/// `/etc/hosts`: address per lower-cased name (Go's `absDomainName` keys:
/// a name with a dot is rooted).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Hosts {
    by_name: HashMap<String, Vec<IpAddr>>,
}

impl Hosts {
    pub fn read(path: &Path) -> Hosts {
        std::fs::read_to_string(path)
            .map(|text| Hosts::parse(&text))
            .unwrap_or_default()
    }

    pub fn parse(text: &str) -> Hosts {
        let mut by_name: HashMap<String, Vec<IpAddr>> = HashMap::new();
        for line in text.lines() {
            let line = line.split('#').next().unwrap_or("");
            let mut fields = line.split_ascii_whitespace();
            let Some(Ok(ip)) = fields.next().map(|a| a.parse::<IpAddr>()) else {
                continue;
            };
            for name in fields {
                by_name
                    .entry(abs_domain_name(&name.to_ascii_lowercase()))
                    .or_default()
                    .push(ip);
            }
        }
        Hosts { by_name }
    }

    pub fn lookup(&self, host: &str) -> &[IpAddr] {
        self.by_name
            .get(&abs_domain_name(&host.to_ascii_lowercase()))
            .map_or(&[], Vec::as_slice)
    }
}

fn abs_domain_name(name: &str) -> String {
    if name.contains('.') && !name.ends_with('.') {
        format!("{name}.")
    } else {
        name.to_string()
    }
}
