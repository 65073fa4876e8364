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
