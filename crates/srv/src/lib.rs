//! DNS SRV records for bootstrapping a cluster: etcd's `client/pkg/srv`
//! (`GetCluster`) over a resolver that reads `/etc/resolv.conf` and
//! `/etc/hosts` as Go's pure resolver does, which is what etcd's
//! `--discovery-srv` runs on.
//!
//! # What it owns
//!
//! * [`wire`]: DNS messages, encoded and decoded by hand (the few record
//!   types SRV bootstrap meets); the decoder is bounded and never panics.
//! * [`resolver`]: Go's stub resolver (`net.LookupSRV`,
//!   `net.ResolveTCPAddr`): resolv.conf's servers, search list, `ndots`,
//!   timeout and attempts; UDP with EDNS0, TCP when the answer is
//!   truncated; Go's order of SRV records (RFC 2782) and Go's error texts.
//! * [`get_cluster`]: etcd's `GetCluster`: the records of one service as
//!   `--initial-cluster` entries, this member found among them by address.
//! * [`zone`]: a fixed set of records answered over UDP and TCP, for tests
//!   that need a DNS server of their own.
//!
//! # What it never does
//!
//! Cache, follow a CNAME chain itself (a recursive server answers with the
//! chain), or know what a member is: the caller (`oxcd`) owns etcd's
//! bootstrap rules (which services, the logs, the errors around them).

pub mod resolver;
pub mod wire;
pub mod zone;

use std::collections::HashMap;
use std::net::SocketAddr;

pub use resolver::{DnsError, ResolvConf, Resolver};

/// One SRV record (Go's `net.SRV`); `target` is rooted (`m1.example.com.`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Srv {
    pub target: String,
    pub port: u16,
    pub priority: u16,
    pub weight: u16,
}

/// The two look-ups etcd's `GetCluster` makes (its `lookupSRV` and
/// `resolveTCPAddr` indirections), so that a test can answer them.
pub trait Lookup {
    /// Go's `net.LookupSRV(service, proto, name)`.
    fn lookup_srv(&self, service: &str, proto: &str, name: &str) -> Result<Vec<Srv>, DnsError>;
    /// Go's `net.ResolveTCPAddr("tcp", host_port)`; the error in Go's words.
    fn resolve_tcp_addr(&self, host_port: &str) -> Result<SocketAddr, String>;
}

/// etcd's `GetCluster`: the `name=scheme://target:port` entries of the SRV
/// records of `_<service>._tcp.<domain>`. A record whose target resolves
/// to the address of one of `advertise_peer_urls` is this member, `name`;
/// the others are named `0`, `1`, … in record order. A record that is this
/// member under another scheme is left out (its error is kept), as is one
/// whose target does not resolve; the call fails only when no entry is
/// left and one of them failed.
pub fn get_cluster(
    lookup: &dyn Lookup,
    service_scheme: &str,
    service: &str,
    name: &str,
    domain: &str,
    advertise_peer_urls: &[String],
) -> Result<Vec<String>, String> {
    let mut advertised: HashMap<SocketAddr, &String> = HashMap::new();
    for url in advertise_peer_urls {
        advertised.insert(lookup.resolve_tcp_addr(url_host(url))?, url);
    }
    let failed = |e: String| format!("error querying DNS SRV records for _{service} {e}");
    let records = lookup
        .lookup_srv(service, "tcp", domain)
        .map_err(|e| failed(e.to_string()))?;
    let mut temp_name = 0;
    let mut parts = Vec::new();
    let mut last_error = None;
    for srv in records {
        let port = srv.port.to_string();
        let addr = match lookup.resolve_tcp_addr(&join_host_port(&srv.target, &port)) {
            Ok(addr) => addr,
            Err(e) => {
                last_error = Some(e);
                continue;
            }
        };
        let own = advertised.get(&addr);
        let member = match own {
            Some(_) => name.to_string(),
            None => {
                temp_name += 1;
                (temp_name - 1).to_string()
            }
        };
        // SRV records have a trailing dot but URL shouldn't.
        let short_host = srv.target.strip_suffix('.').unwrap_or(&srv.target);
        let url_host = join_host_port(short_host, &port);
        match own {
            Some(url) if url_scheme(url) != service_scheme => {
                last_error = Some(format!(
                    "bootstrap at {service_scheme}://{url_host} from DNS for {service} has scheme mismatch with expected peer {url}"
                ));
            }
            _ => parts.push(format!("{member}={service_scheme}://{url_host}")),
        }
    }
    match (parts.is_empty(), last_error) {
        (true, Some(e)) => Err(failed(e)),
        _ => Ok(parts),
    }
}

/// A URL's `host:port` (what Go's `url.URL.Host` holds).
fn url_host(url: &str) -> &str {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    rest.split(['/', '?', '#']).next().unwrap_or(rest)
}

fn url_scheme(url: &str) -> &str {
    url.split_once("://").map_or("", |(scheme, _)| scheme)
}

/// Go's `net.JoinHostPort`.
pub fn join_host_port(host: &str, port: &str) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// Go's `isDomainName`: a presentation-form name of letter-digit-hyphen
/// labels (underscores allowed, as SRV names have them), 1 to 63 bytes
/// each, at most 253 bytes (254 rooted), not all digits.
pub fn is_domain_name(s: &str) -> bool {
    let bytes = s.as_bytes();
    let len = bytes.len();
    if s == "." {
        return true;
    }
    if len == 0 || len > 254 || len == 254 && bytes[len - 1] != b'.' {
        return false;
    }
    let mut last = b'.';
    let mut non_numeric = false;
    let mut part_len = 0;
    for &c in bytes {
        match c {
            b'a'..=b'z' | b'A'..=b'Z' | b'_' => {
                non_numeric = true;
                part_len += 1;
            }
            b'0'..=b'9' => part_len += 1,
            b'-' => {
                if last == b'.' {
                    return false;
                }
                part_len += 1;
                non_numeric = true;
            }
            b'.' => {
                if last == b'.' || last == b'-' || part_len > 63 || part_len == 0 {
                    return false;
                }
                part_len = 0;
            }
            _ => return false,
        }
        last = c;
    }
    last != b'-' && part_len <= 63 && non_numeric
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Records and addresses as a test says.
    struct Fixed {
        srvs: Vec<(&'static str, Result<Vec<Srv>, DnsError>)>,
        addrs: Vec<(&'static str, &'static str)>,
    }

    impl Lookup for Fixed {
        fn lookup_srv(&self, service: &str, _: &str, _: &str) -> Result<Vec<Srv>, DnsError> {
            self.srvs
                .iter()
                .find(|(s, _)| *s == service)
                .map(|(_, r)| r.clone())
                .unwrap_or_else(|| Err(DnsError::not_found(service, None)))
        }
        fn resolve_tcp_addr(&self, host_port: &str) -> Result<SocketAddr, String> {
            self.addrs
                .iter()
                .find(|(h, _)| *h == host_port)
                .map(|(_, a)| a.parse().unwrap())
                .ok_or_else(|| format!("lookup {host_port}: no such host"))
        }
    }

    fn srv(target: &str, port: u16) -> Srv {
        Srv {
            target: target.into(),
            port,
            priority: 0,
            weight: 0,
        }
    }

    #[test]
    fn the_member_is_found_by_address_and_the_others_numbered() {
        let lookup = Fixed {
            srvs: vec![(
                "etcd-server",
                Ok(vec![
                    srv("a.x.", 2380),
                    srv("b.x.", 2380),
                    srv("c.x.", 2380),
                ]),
            )],
            addrs: vec![
                ("a.x.:2380", "10.0.0.1:2380"),
                ("b.x.:2380", "10.0.0.2:2380"),
                ("c.x.:2380", "10.0.0.3:2380"),
                ("10.0.0.2:2380", "10.0.0.2:2380"),
            ],
        };
        let cluster = get_cluster(
            &lookup,
            "http",
            "etcd-server",
            "m2",
            "x",
            &["http://10.0.0.2:2380".into()],
        )
        .unwrap();
        assert_eq!(
            cluster,
            [
                "0=http://a.x:2380",
                "m2=http://b.x:2380",
                "1=http://c.x:2380"
            ]
        );
    }

    #[test]
    fn a_scheme_mismatch_or_an_unresolved_target_is_left_out() {
        let lookup = Fixed {
            srvs: vec![(
                "etcd-server-ssl",
                Ok(vec![srv("a.x.", 2380), srv("gone.x.", 2380)]),
            )],
            addrs: vec![
                ("a.x.:2380", "10.0.0.1:2380"),
                ("10.0.0.1:2380", "10.0.0.1:2380"),
            ],
        };
        let err = get_cluster(
            &lookup,
            "https",
            "etcd-server-ssl",
            "m1",
            "x",
            &["http://10.0.0.1:2380".into()],
        )
        .unwrap_err();
        // the last error is the one kept
        assert_eq!(
            err,
            "error querying DNS SRV records for _etcd-server-ssl lookup gone.x.:2380: no such host"
        );
        let lookup = Fixed {
            srvs: vec![("etcd-server-ssl", Ok(vec![srv("a.x.", 2380)]))],
            ..lookup
        };
        let err = get_cluster(
            &lookup,
            "https",
            "etcd-server-ssl",
            "m1",
            "x",
            &["http://10.0.0.1:2380".into()],
        )
        .unwrap_err();
        assert_eq!(
            err,
            "error querying DNS SRV records for _etcd-server-ssl bootstrap at https://a.x:2380 from DNS for etcd-server-ssl has scheme mismatch with expected peer http://10.0.0.1:2380"
        );
    }

    #[test]
    fn domain_names_as_go_judges_them() {
        for good in ["a.b", "a.b.", "_etcd-server._tcp.x", "x-1.y", ".", "1a.2"] {
            assert!(is_domain_name(good), "{good}");
        }
        for bad in [
            "",
            "a..b",
            "-a.b",
            "a-.b",
            "1.2.3.4",
            "a b",
            "a\u{fffd}.b",
            ".a",
        ] {
            assert!(!is_domain_name(bad), "{bad}");
        }
        assert!(!is_domain_name(&format!("{}.b", "a".repeat(64))));
    }
}
