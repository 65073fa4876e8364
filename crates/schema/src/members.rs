//! Members: the `members` table's records (etcd's Member message) and
//! member and cluster identity, derived exactly as etcd derives them
//! (etcdserver/api/membership): a member ID is the first 8 bytes (big
//! endian) of sha1(sorted peer URLs ++ cluster token); the cluster ID is the
//! same over the sorted member IDs. Equal flags give equal IDs to etcd's.

use prost::Message;
use sha1::{Digest, Sha1};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    pub id: u64,
    pub name: String,
    pub peer_urls: Vec<String>,
    pub client_urls: Vec<String>,
    pub is_learner: bool,
}

/// A member as the backend's members table stores it (etcd's Member message).
pub fn encode(m: &Member) -> Vec<u8> {
    api::etcdserverpb::Member {
        id: m.id,
        name: m.name.clone(),
        peer_ur_ls: m.peer_urls.clone(),
        client_ur_ls: m.client_urls.clone(),
        is_learner: m.is_learner,
    }
    .encode_to_vec()
}

pub fn decode(bytes: &[u8]) -> Option<Member> {
    let m = api::etcdserverpb::Member::decode(bytes).ok()?;
    Some(Member {
        id: m.id,
        name: m.name,
        peer_urls: m.peer_ur_ls,
        client_urls: m.client_ur_ls,
        is_learner: m.is_learner,
    })
}

pub fn member_id(peer_urls: &[String], cluster_token: &str) -> u64 {
    let mut urls = peer_urls.to_vec();
    urls.sort();
    let mut hasher = Sha1::new();
    for url in &urls {
        hasher.update(url.as_bytes());
    }
    hasher.update(cluster_token.as_bytes());
    first_u64(&hasher.finalize())
}

/// The ID etcd gives a member added at run time (MemberAdd): the same hash
/// with the decimal Unix time in seconds in place of the cluster token
/// (membership.NewMember with an empty cluster name and `now`).
pub fn added_member_id(peer_urls: &[String], unix_secs: i64) -> u64 {
    member_id(peer_urls, &unix_secs.to_string())
}

/// The record of a member in the `members_removed` table (etcd writes
/// the same bytes in its bucket).
pub const REMOVED_RECORD: &[u8] = b"removed";

/// etcd's types.NewURLs: every URL parses, is http(s) with a host:port and
/// no path, or unix(s); at least one; returned sorted (as etcd keeps a
/// member's peer URLs).
pub fn parse_peer_urls(urls: &[String]) -> Result<Vec<String>, String> {
    if urls.is_empty() {
        return Err("no valid URLs given".to_string());
    }
    let mut out = Vec::with_capacity(urls.len());
    for raw in urls {
        let input = raw.trim();
        let (scheme, rest) = input
            .split_once("://")
            .ok_or_else(|| format!("URL scheme must be http, https, unix, or unixs: {input}"))?;
        match scheme {
            "http" | "https" => {
                let (authority, path) = match rest.find(['/', '?', '#']) {
                    Some(i) => rest.split_at(i),
                    None => (rest, ""),
                };
                let host_port = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
                let port_ok = host_port.rsplit_once(':').is_some_and(|(host, port)| {
                    !port.contains(']') && (!host.contains(':') || host.starts_with('['))
                });
                if !port_ok {
                    return Err(format!(
                        "URL address does not have the form \"host:port\": {input}"
                    ));
                }
                if path.starts_with('/') {
                    return Err(format!("URL must not contain a path: {input}"));
                }
            }
            "unix" | "unixs" => {}
            _ => {
                return Err(format!(
                    "URL scheme must be http, https, unix, or unixs: {input}"
                ))
            }
        }
        out.push(input.to_string());
    }
    out.sort();
    Ok(out)
}

pub fn cluster_id(member_ids: &[u64]) -> u64 {
    let mut ids = member_ids.to_vec();
    ids.sort_unstable();
    let mut hasher = Sha1::new();
    for id in ids {
        hasher.update(id.to_be_bytes());
    }
    first_u64(&hasher.finalize())
}

fn first_u64(hash: &[u8]) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&hash[..8]);
    u64::from_be_bytes(b)
}

/// Parses etcd's `--initial-cluster` value: `name=url,name=url2,other=url3`.
pub fn parse_initial_cluster(spec: &str) -> Result<Vec<(String, Vec<String>)>, String> {
    let mut members: Vec<(String, Vec<String>)> = Vec::new();
    for part in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (name, url) = part
            .split_once('=')
            .ok_or_else(|| format!("--initial-cluster has an entry without '=': {part:?}"))?;
        match members.iter_mut().find(|(n, _)| n == name) {
            Some((_, urls)) => urls.push(url.to_string()),
            None => members.push((name.to_string(), vec![url.to_string()])),
        }
    }
    if members.is_empty() {
        return Err("--initial-cluster is empty".to_string());
    }
    Ok(members)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_member_and_cluster_ids_equal_etcds() {
        // etcd 3.x with no flags: member 8e9e05c52164694d, cluster cdf818194e3a8c32.
        let id = member_id(&["http://localhost:2380".to_string()], "etcd-cluster");
        assert_eq!(format!("{id:x}"), "8e9e05c52164694d");
        assert_eq!(format!("{:x}", cluster_id(&[id])), "cdf818194e3a8c32");
    }

    #[test]
    fn an_added_members_id_hashes_its_sorted_urls_and_the_time_as_etcds() {
        // etcd 3.5: membership.NewMember("", ["http://127.0.0.1:2380"], "", time.Unix(1700000000, 0))
        let urls = vec!["http://127.0.0.1:2380".to_string()];
        assert_eq!(
            added_member_id(&urls, 1_700_000_000),
            member_id(&urls, "1700000000")
        );
        let two = vec!["http://b:1".to_string(), "http://a:1".to_string()];
        let mut sorted = two.clone();
        sorted.sort();
        assert_eq!(added_member_id(&two, 5), added_member_id(&sorted, 5));
        assert_ne!(added_member_id(&urls, 5), added_member_id(&urls, 6));
    }

    #[test]
    fn peer_urls_are_checked_as_etcds_new_urls() {
        let ok = parse_peer_urls(&["http://b:2380".into(), "https://a:2380".into()]).unwrap();
        assert_eq!(ok, ["http://b:2380", "https://a:2380"]);
        assert!(parse_peer_urls(&["unix://sock".into()]).is_ok());
        assert!(parse_peer_urls(&["http://[::1]:2380".into()]).is_ok());
        for bad in [
            "127.0.0.1:2380",
            "ftp://a:1",
            "http://a",
            "http://a:1/path",
            "http://::1",
        ] {
            assert!(parse_peer_urls(&[bad.to_string()]).is_err(), "{bad}");
        }
        assert!(parse_peer_urls(&[]).is_err());
    }

    #[test]
    fn initial_cluster_groups_urls_by_name() {
        let m = parse_initial_cluster("a=http://1:2380,b=http://2:2380,a=http://3:2380").unwrap();
        assert_eq!(m.len(), 2);
        assert_eq!(m[0].1, vec!["http://1:2380", "http://3:2380"]);
        assert!(parse_initial_cluster("nonsense").is_err());
    }

    #[test]
    fn a_member_record_round_trips() {
        let m = Member {
            id: 7,
            name: "m1".into(),
            peer_urls: vec!["http://a:2380".into()],
            client_urls: vec!["http://a:2379".into()],
            is_learner: true,
        };
        assert_eq!(decode(&encode(&m)), Some(m));
        assert_eq!(decode(&[0xff]), None);
    }
}
