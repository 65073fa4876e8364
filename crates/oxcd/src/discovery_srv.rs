//! `--discovery-srv`: the initial cluster from DNS SRV records, as etcd's
//! embed `PeerURLsMapAndToken` and `GetDNSClusterNames` make it.
//!
//! etcd asks for `_etcd-server-ssl[-NAME]._tcp.DOMAIN` (members at
//! `https://`) and `_etcd-server[-NAME]._tcp.DOMAIN` (at `http://`),
//! `-NAME` being `--discovery-srv-name` when given, and joins what both
//! found. A record whose target resolves to the address of one of
//! `--initial-advertise-peer-urls` is this member; the others are named
//! `0`, `1`, … (numbering starts again for the second service), names that
//! last until each member publishes its own. The peer URLs are the
//! records' targets (`http://m1.example.com:2380`), which is what the
//! member IDs are made of.
//!
//! Only a member that is not initialized asks (etcd's
//! `isMemberInitialized`: a WAL in the data dir); one that is takes its
//! cluster from its data dir. The lines logged and the errors are etcd's.

use embed::ServerConfig;

/// `--discovery-srv` and `--discovery-srv-name`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DiscoverySrv {
    pub domain: String,
    pub service_name: String,
}

impl DiscoverySrv {
    /// The service suffix etcd appends (`-NAME`).
    fn suffix(&self) -> String {
        match self.service_name.as_str() {
            "" => String::new(),
            name => format!("-{name}"),
        }
    }

    /// etcd's `GetDNSClusterNames`: the entries both services gave, and
    /// their errors (`; `-joined, as multierr prints them). Logs etcd's
    /// `get cluster for etcd-server-ssl SRV` and `... etcd-server SRV`.
    pub fn cluster_names(
        &self,
        lookup: &dyn srv::Lookup,
        name: &str,
        advertise_peer_urls: &[String],
    ) -> (Vec<String>, Option<String>) {
        let suffix = self.suffix();
        let ssl_service = format!("etcd-server-ssl{suffix}");
        let ssl = srv::get_cluster(
            lookup,
            "https",
            &ssl_service,
            name,
            &self.domain,
            advertise_peer_urls,
        );
        let mut found = ssl.clone().unwrap_or_default();
        self.log_found(
            "get cluster for etcd-server-ssl SRV",
            "https",
            &ssl_service,
            name,
            advertise_peer_urls,
            &found,
            ssl.as_ref().err(),
        );
        let service = format!("etcd-server{suffix}");
        let plain = srv::get_cluster(
            lookup,
            "http",
            &service,
            name,
            &self.domain,
            advertise_peer_urls,
        );
        if let Ok(more) = &plain {
            found.extend(more.iter().cloned());
        }
        self.log_found(
            "get cluster for etcd-server SRV",
            "http",
            &service,
            name,
            advertise_peer_urls,
            &found,
            plain.as_ref().err(),
        );
        let errors: Vec<String> = [ssl.err(), plain.err()].into_iter().flatten().collect();
        (found, (!errors.is_empty()).then(|| errors.join("; ")))
    }

    #[allow(clippy::too_many_arguments)]
    fn log_found(
        &self,
        msg: &str,
        scheme: &str,
        service: &str,
        name: &str,
        advertise_peer_urls: &[String],
        found: &[String],
        error: Option<&String>,
    ) {
        match error {
            Some(error) => tracing::info!(
                "service-scheme" = scheme,
                "service-name" = service,
                "server-name" = name,
                "discovery-srv" = %self.domain,
                "advertise-peer-urls" = %embed::logutil::strings(advertise_peer_urls),
                "found-cluster" = %embed::logutil::strings(found),
                error = %error,
                "{msg}"
            ),
            None => tracing::info!(
                "service-scheme" = scheme,
                "service-name" = service,
                "server-name" = name,
                "discovery-srv" = %self.domain,
                "advertise-peer-urls" = %embed::logutil::strings(advertise_peer_urls),
                "found-cluster" = %embed::logutil::strings(found),
                "{msg}"
            ),
        }
    }

    /// etcd's `PeerURLsMapAndToken` for a member: the `--initial-cluster`
    /// the records make, or etcd's error (`cannot find local etcd member
    /// "m4" in SRV records`, or the look-ups' errors when nothing was
    /// found). Logs etcd's `failed to resolve during SRV discovery` and a
    /// `got bootstrap from DNS for etcd-server` line per member.
    pub fn initial_cluster(
        &self,
        lookup: &dyn srv::Lookup,
        name: &str,
        advertise_peer_urls: &[String],
    ) -> Result<String, String> {
        let (found, error) = self.cluster_names(lookup, name, advertise_peer_urls);
        if let Some(error) = &error {
            tracing::warn!(error = %error, "failed to resolve during SRV discovery");
        }
        if found.is_empty() {
            return Err(error.unwrap_or_default());
        }
        for node in &found {
            tracing::info!(node = %node, "got bootstrap from DNS for etcd-server");
        }
        if !found
            .iter()
            .any(|entry| entry.split_once('=').is_some_and(|(n, _)| n == name))
        {
            return Err(format!(
                "cannot find local etcd member {name:?} in SRV records"
            ));
        }
        Ok(found.join(","))
    }

    /// Sets `cfg.initial_cluster` from the records unless the member is
    /// initialized; the error as etcd's StartEtcd words it. With `https`
    /// members and no `--peer-trusted-ca-file`, peers' certificates are
    /// verified for the domain (etcd's `PeerTLSInfo.ServerName`).
    pub fn bootstrap(
        &self,
        cfg: &mut ServerConfig,
        lookup: &dyn srv::Lookup,
    ) -> Result<(), String> {
        if etcdserver::bootstrap::is_member_initialized(cfg) {
            return Ok(());
        }
        let cluster = self
            .initial_cluster(lookup, &cfg.name, &cfg.initial_advertise_peer_urls)
            .map_err(|e| format!("error setting up initial cluster: {e}"))?;
        if cluster.contains("https://") && cfg.peer_tls.trusted_ca_file.is_none() {
            cfg.peer_tls.server_name = Some(self.domain.clone());
        }
        cfg.initial_cluster = cluster;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::SocketAddr;

    /// SRV records of a few services and the addresses of their targets.
    struct Records {
        services: Vec<(&'static str, Vec<(&'static str, u16)>)>,
        addrs: Vec<(&'static str, &'static str)>,
    }

    impl srv::Lookup for Records {
        fn lookup_srv(
            &self,
            service: &str,
            _: &str,
            domain: &str,
        ) -> Result<Vec<srv::Srv>, srv::DnsError> {
            let full = format!("_{service}._tcp.{domain}");
            match self.services.iter().find(|(s, _)| *s == service) {
                Some((_, targets)) => Ok(targets
                    .iter()
                    .map(|(target, port)| srv::Srv {
                        target: target.to_string(),
                        port: *port,
                        priority: 0,
                        weight: 0,
                    })
                    .collect()),
                None => Err(srv::DnsError::not_found(
                    &full,
                    Some("10.0.0.53:53".parse().unwrap()),
                )),
            }
        }

        fn resolve_tcp_addr(&self, host_port: &str) -> Result<SocketAddr, String> {
            if let Ok(addr) = host_port.parse() {
                return Ok(addr);
            }
            self.addrs
                .iter()
                .find(|(h, _)| *h == host_port)
                .map(|(_, a)| a.parse().unwrap())
                .ok_or_else(|| format!("lookup {host_port}: no such host"))
        }
    }

    fn three() -> Records {
        Records {
            services: vec![(
                "etcd-server",
                vec![("m1.x.", 2380), ("m2.x.", 2380), ("m3.x.", 2380)],
            )],
            addrs: vec![
                ("m1.x.:2380", "10.0.0.1:2380"),
                ("m2.x.:2380", "10.0.0.2:2380"),
                ("m3.x.:2380", "10.0.0.3:2380"),
            ],
        }
    }

    fn discovery(name: &str) -> DiscoverySrv {
        DiscoverySrv {
            domain: "x".into(),
            service_name: name.into(),
        }
    }

    #[test]
    fn the_records_make_the_initial_cluster_as_etcds() {
        // as etcd 3.5.16 printed it for the same records
        let cluster = discovery("")
            .initial_cluster(&three(), "m2", &["http://10.0.0.2:2380".into()])
            .unwrap();
        assert_eq!(
            cluster,
            "0=http://m1.x:2380,m2=http://m2.x:2380,1=http://m3.x:2380"
        );
    }

    #[test]
    fn both_services_are_joined_each_numbered_from_zero() {
        let records = Records {
            services: vec![
                ("etcd-server-ssl-c", vec![("m1.x.", 2380)]),
                ("etcd-server-c", vec![("m2.x.", 2380), ("m3.x.", 2380)]),
            ],
            ..three()
        };
        let cluster = discovery("c")
            .initial_cluster(&records, "m3", &["http://10.0.0.3:2380".into()])
            .unwrap();
        assert_eq!(
            cluster,
            "0=https://m1.x:2380,0=http://m2.x:2380,m3=http://m3.x:2380"
        );
    }

    #[test]
    fn a_member_not_in_the_records_or_no_records_is_etcds_error() {
        let err = discovery("")
            .initial_cluster(&three(), "m4", &["http://10.0.0.4:2380".into()])
            .unwrap_err();
        assert_eq!(err, "cannot find local etcd member \"m4\" in SRV records");
        let err = discovery("nope")
            .initial_cluster(&three(), "m1", &["http://10.0.0.1:2380".into()])
            .unwrap_err();
        assert_eq!(
            err,
            "error querying DNS SRV records for _etcd-server-ssl-nope lookup _etcd-server-ssl-nope._tcp.x on 10.0.0.53:53: no such host; \
             error querying DNS SRV records for _etcd-server-nope lookup _etcd-server-nope._tcp.x on 10.0.0.53:53: no such host"
        );
    }

    #[test]
    fn https_peers_without_a_ca_are_verified_for_the_domain() {
        let records = Records {
            services: vec![
                ("etcd-server-ssl", vec![("m1.x.", 2380)]),
                // m1 again, at http: left out, a scheme mismatch
                (
                    "etcd-server",
                    vec![("m1.x.", 2380), ("m2.x.", 2380), ("m3.x.", 2380)],
                ),
            ],
            ..three()
        };
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = ServerConfig {
            data_dir: dir.path().to_path_buf(),
            name: "m1".into(),
            initial_advertise_peer_urls: vec!["https://10.0.0.1:2380".into()],
            ..ServerConfig::default()
        };
        let mut with_ca = cfg.clone();
        discovery("").bootstrap(&mut cfg, &records).unwrap();
        assert_eq!(
            cfg.initial_cluster,
            "m1=https://m1.x:2380,0=http://m2.x:2380,1=http://m3.x:2380"
        );
        assert_eq!(cfg.peer_tls.server_name.as_deref(), Some("x"));
        with_ca.peer_tls.trusted_ca_file = Some("/ca.pem".into());
        discovery("").bootstrap(&mut with_ca, &records).unwrap();
        assert_eq!(with_ca.peer_tls.server_name, None);
    }

    #[test]
    fn the_config_files_keys_are_read_as_the_flags() {
        let args = ["--config-file".to_string(), "/etcd.yml".to_string()];
        let flags = match crate::flags::parse(&args, &[]).unwrap() {
            crate::flags::Parsed::Run(flags) => flags,
            other => panic!("{other:?}"),
        };
        let text = "name: m1\ndiscovery-srv: example.com\ndiscovery-srv-name: c1\n";
        let loaded = crate::config_file::load(&flags, "/etcd.yml", text).unwrap();
        let cfg = crate::config_from(&loaded).unwrap();
        assert_eq!(cfg.discovery_srv, Some(discovery_of("example.com", "c1")));
        // etcd's configFromFile drops the default initial cluster
        assert_eq!(cfg.server.initial_cluster, "");
    }

    fn discovery_of(domain: &str, name: &str) -> DiscoverySrv {
        DiscoverySrv {
            domain: domain.into(),
            service_name: name.into(),
        }
    }

    #[test]
    fn an_initialized_member_asks_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = ServerConfig {
            data_dir: dir.path().to_path_buf(),
            name: "m4".into(),
            initial_cluster: String::new(),
            ..ServerConfig::default()
        };
        let no_records = Records {
            services: Vec::new(),
            addrs: Vec::new(),
        };
        assert!(discovery("").bootstrap(&mut cfg, &no_records).is_err());
        std::fs::create_dir_all(cfg.member_dir().join("wal")).unwrap();
        std::fs::write(cfg.member_dir().join("wal").join("0.wal"), b"").unwrap();
        discovery("").bootstrap(&mut cfg, &no_records).unwrap();
        assert_eq!(cfg.initial_cluster, "");
    }
}
