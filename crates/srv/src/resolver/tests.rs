use super::conf::default_servers;
use super::*;
use crate::zone::{Server, Zone};

fn conf_for(servers: Vec<SocketAddr>) -> ResolvConf {
    ResolvConf {
        servers,
        search: Vec::new(),
        timeout: Duration::from_secs(2),
        attempts: 1,
        ..ResolvConf::defaults("")
    }
}

fn serve(zone: Zone) -> (Server, Resolver) {
    let server = Server::start("127.0.0.1:0".parse().unwrap(), zone).unwrap();
    let resolver = Resolver::new(conf_for(vec![server.addr()]), Hosts::default());
    (server, resolver)
}

/// A port nothing listens on (UDP to it is refused at once on loopback).
fn closed_port() -> SocketAddr {
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    socket.local_addr().unwrap()
}

#[test]
fn resolv_conf_reads_as_gos() {
    let conf = ResolvConf::parse(
        "# comment\n; other\nnameserver 10.0.0.1\nnameserver dns.example\nnameserver ::1\n\
         nameserver 10.0.0.2\nnameserver 10.0.0.3\nsearch a.example b.example. .\n\
         options ndots:20 timeout:0 attempts:3 rotate use-vc bogus\n",
        "host.local.example",
    );
    assert_eq!(
        conf.servers,
        [
            "10.0.0.1:53".parse::<SocketAddr>().unwrap(),
            "[::1]:53".parse().unwrap(),
            "10.0.0.2:53".parse().unwrap()
        ]
    );
    assert_eq!(conf.search, ["a.example.", "b.example."]);
    assert_eq!(conf.ndots, 15);
    assert_eq!(conf.timeout, Duration::from_secs(1));
    assert_eq!(conf.attempts, 3);
    assert!(conf.rotate && conf.use_tcp);
    // nothing said: Go's defaults, the host name's domain searched
    let empty = ResolvConf::parse("", "host.local.example");
    assert_eq!(empty.servers, default_servers());
    assert_eq!(empty.search, ["local.example."]);
    assert_eq!((empty.ndots, empty.attempts), (1, 2));
    assert_eq!(
        ResolvConf::parse("domain d.example\n", "h").search,
        ["d.example."]
    );
}

#[test]
fn names_are_tried_as_gos_name_list_says() {
    let conf = ResolvConf {
        search: vec!["s.example.".into()],
        ..ResolvConf::defaults("")
    };
    assert_eq!(
        conf.name_list("_etcd-server._tcp.x.example"),
        [
            "_etcd-server._tcp.x.example.",
            "_etcd-server._tcp.x.example.s.example."
        ]
    );
    assert_eq!(conf.name_list("x.example."), ["x.example."]);
    assert_eq!(conf.name_list("host"), ["host.s.example.", "host."]);
    let kubernetes = ResolvConf { ndots: 5, ..conf };
    assert_eq!(
        kubernetes.name_list("_etcd-server._tcp.x"),
        ["_etcd-server._tcp.x.s.example.", "_etcd-server._tcp.x."]
    );
    assert!(kubernetes.name_list("hidden.onion.").is_empty());
}

#[test]
fn hosts_come_first_and_match_without_case() {
    let hosts = Hosts::parse("127.0.0.1 localhost\n10.1.1.1 Peer.Example # comment\nbad line\n");
    assert_eq!(
        hosts.lookup("peer.example."),
        ["10.1.1.1".parse::<IpAddr>().unwrap()]
    );
    assert_eq!(
        hosts.lookup("LOCALHOST"),
        ["127.0.0.1".parse::<IpAddr>().unwrap()]
    );
    let resolver = Resolver::new(conf_for(vec![closed_port()]), hosts);
    assert_eq!(
        resolver.resolve_tcp_addr("peer.example:2380").unwrap(),
        "10.1.1.1:2380".parse().unwrap()
    );
    assert_eq!(
        resolver.resolve_tcp_addr("[::ffff:10.0.0.9]:1").unwrap(),
        "10.0.0.9:1".parse().unwrap()
    );
    assert_eq!(
        resolver.resolve_tcp_addr("peer.example").unwrap_err(),
        "address peer.example: missing port in address"
    );
}

#[test]
fn srv_records_and_their_targets_resolve_from_a_server() {
    let zone = Zone::new()
        .with_srv("_etcd-server._tcp.x.test", 0, 0, 2380, "m1.x.test")
        .with_srv("_etcd-server._tcp.x.test", 0, 0, 2381, "m2.x.test")
        .with_srv("_etcd-server._tcp.x.test", 10, 0, 2382, "m3.x.test")
        .with_a("m1.x.test", Ipv4Addr::new(10, 0, 0, 1))
        .with_aaaa("m2.x.test", "fd00::2".parse().unwrap())
        .with_a("m2.x.test", Ipv4Addr::new(10, 0, 0, 2));
    let (server, resolver) = serve(zone);
    let srvs = resolver.lookup_srv("etcd-server", "tcp", "x.test").unwrap();
    let targets: Vec<(&str, u16)> = srvs.iter().map(|s| (s.target.as_str(), s.port)).collect();
    assert_eq!(
        targets,
        [
            ("m1.x.test.", 2380),
            ("m2.x.test.", 2381),
            ("m3.x.test.", 2382)
        ]
    );
    assert_eq!(
        resolver.resolve_tcp_addr("m2.x.test.:2381").unwrap(),
        "10.0.0.2:2381".parse().unwrap()
    );
    let err = resolver
        .lookup_srv("etcd-server-ssl", "tcp", "x.test")
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "lookup _etcd-server-ssl._tcp.x.test on {}: no such host",
            server.addr()
        )
    );
    // a known name without the type asked: no such host too
    let err = resolver.resolve_tcp_addr("m3.x.test:1").unwrap_err();
    assert_eq!(
        err,
        format!("lookup m3.x.test on {}: no such host", server.addr())
    );
    assert!(server
        .questions()
        .contains(&("_etcd-server._tcp.x.test.".to_string(), wire::TYPE_SRV)));
}

#[test]
fn a_truncated_answer_is_asked_again_over_tcp() {
    let mut zone = Zone::new();
    for i in 0..60 {
        let target = format!("member-with-a-long-name-{i}.x.test");
        zone = zone.with_srv("_etcd-server._tcp.x.test", 0, 0, 2380, &target);
    }
    let (server, resolver) = serve(zone);
    let srvs = resolver.lookup_srv("etcd-server", "tcp", "x.test").unwrap();
    assert_eq!(srvs.len(), 60);
    // once over UDP (truncated), once over TCP
    assert_eq!(server.questions().len(), 2);
}

#[test]
fn a_dead_server_passes_to_the_next_and_all_dead_is_gos_error() {
    let zone = Zone::new().with_srv("_s._tcp.x.test", 0, 0, 1, "a.x.test");
    let (server, _) = serve(zone);
    let dead = closed_port();
    let resolver = Resolver::new(conf_for(vec![dead, server.addr()]), Hosts::default());
    assert_eq!(resolver.lookup_srv("s", "tcp", "x.test").unwrap().len(), 1);
    let resolver = Resolver::new(conf_for(vec![dead]), Hosts::default());
    let err = resolver
        .lookup_srv("s", "tcp", "x.test")
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with(&format!(
            "lookup _s._tcp.x.test on {dead}: read udp 127.0.0.1:"
        )) && err.ends_with(&format!("->{dead}: read: connection refused")),
        "{err}"
    );
}

#[test]
fn invalid_names_are_not_asked_and_invalid_targets_fail_the_lookup() {
    let zone = Zone::new()
        .with_srv("_s._tcp.x.test", 0, 0, 1, "good.x.test")
        .with_srv("_s._tcp.x.test", 0, 0, 1, "bad_-.x.test");
    let (server, resolver) = serve(zone);
    let err = resolver.lookup_srv("s", "tcp", "x.test").unwrap_err();
    assert_eq!(
        err.to_string(),
        "lookup x.test: DNS response contained records which contain invalid names"
    );
    let err = resolver.lookup_srv("s", "tcp", "bad domain").unwrap_err();
    assert_eq!(err.to_string(), "lookup _s._tcp.bad domain: no such host");
    assert_eq!(server.questions().len(), 1);
}

#[test]
fn records_are_ordered_by_priority_then_drawn_by_weight() {
    let srv = |priority, weight, target: &str| Srv {
        target: target.into(),
        port: 1,
        priority,
        weight,
    };
    let mut first_heavy = 0;
    for _ in 0..400 {
        let mut srvs = vec![srv(2, 0, "z"), srv(1, 1, "light"), srv(1, 99, "heavy")];
        sort_by_priority_weight(&mut srvs);
        assert_eq!(srvs[2].target, "z");
        first_heavy += usize::from(srvs[0].target == "heavy");
    }
    // 99 in 100 on average; far below would be a wrong draw
    assert!(first_heavy > 300, "{first_heavy}");
    // weights all zero: the answer's order
    let mut srvs = vec![srv(0, 0, "a"), srv(0, 0, "b"), srv(0, 0, "c")];
    sort_by_priority_weight(&mut srvs);
    assert_eq!(
        srvs.iter().map(|s| s.target.as_str()).collect::<String>(),
        "abc"
    );
}
