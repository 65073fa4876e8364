//! Bootstrap (etcd's etcdserver/bootstrap.go): the data dir's checks, who
//! this member is (member and cluster IDs, known members), and the state
//! rebuilt from the backend (alarms, leases).

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};

use mvcc::Store;

use crate::alarms::Alarms;
use crate::config::ServerConfig;
use crate::membership::Member as MemberInfo;
use lease::Lessor;
use schema::members as membership;

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("{0}")]
    Config(String),
    #[error("{0}")]
    DataDir(String),
    #[error("failed to open backend: {0}")]
    Backend(#[from] mvcc::MvccError),
    #[error("failed to start raft: {0}")]
    Raft(#[from] consensus::ConsensusError),
    #[error("failed to listen on {url}: {error}")]
    Listen { url: String, error: std::io::Error },
    #[error("{0}")]
    Corrupt(String),
}
/// Rebuilds the alarms from the backend's alarm table.
pub fn recover_alarms(alarms: &Alarms, store: &Store) -> Result<(), mvcc::MvccError> {
    let records = store.side_records(mvcc::SideTable::Alarms)?;
    alarms.recover(records.into_values());
    Ok(())
}

/// Rebuilds the lessor from the backend's lease table and leased keys.
pub fn recover_lessor(lessor: &Lessor, store: &Store) -> Result<(), mvcc::MvccError> {
    let records = store.side_records(mvcc::SideTable::Leases)?;
    lessor.recover(records.into_values(), store.take_loaded_leased_keys());
    Ok(())
}
/// Whether `url` asks for TLS (`https://`, `unixs://`).
pub fn is_tls_url(url: &str) -> bool {
    url.starts_with("https://") || url.starts_with("unixs://")
}

/// Where a listener binds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ListenAddr {
    /// `http://` and `https://` URLs.
    Tcp(SocketAddr),
    /// `unix://` and `unixs://` URLs: a socket file, relative to the
    /// working directory unless absolute.
    Unix(PathBuf),
}

/// The address of a client URL: `http://host:port`, `https://host:port`,
/// or, as etcd's `resolveUrl` (server/embed/etcd.go), the socket file of
/// `unix://` or `unixs://` URL: its host (with the port) followed by its
/// path, so `unix://localhost:2379` is the file `localhost:2379` in the
/// working directory and `unix:///run/etcd.sock` is `/run/etcd.sock`.
pub fn parse_listen_url(url: &str) -> Result<ListenAddr, StartError> {
    let parsed = url::Url::parse(url)
        .map_err(|e| StartError::Config(format!("invalid URL {url:?}: {e}")))?;
    match parsed.scheme() {
        "unix" | "unixs" => {
            // From the URL as written (the parsed one normalizes ports):
            // Go's Host (userinfo dropped) then its unescaped Path.
            let rest = url.split_once("://").map_or("", |(_, rest)| rest);
            let rest = rest.split(['?', '#']).next().unwrap_or_default();
            let (authority, path) = rest.find('/').map_or((rest, ""), |i| rest.split_at(i));
            let host = authority
                .rsplit_once('@')
                .map_or(authority, |(_, host)| host);
            let path = format!("{host}{}", percent_decoded(path));
            if path.is_empty() {
                return Err(StartError::Config(format!(
                    "unix socket URL has no path: {url}"
                )));
            }
            Ok(ListenAddr::Unix(PathBuf::from(path)))
        }
        _ => parse_url(url).map(ListenAddr::Tcp),
    }
}

/// Go's URL path unescaping (what `url.URL.Path` holds); an invalid escape
/// stays as written (the `url` crate accepted the URL already).
fn percent_decoded(path: &str) -> String {
    let bytes = path.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(byte)) => {
                out.push(byte);
                i += 3;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The address of an `http://` or `https://` URL. Unix socket URLs are
/// served on the client URLs only ([`parse_listen_url`]).
pub fn parse_url(url: &str) -> Result<SocketAddr, StartError> {
    let parsed = url::Url::parse(url)
        .map_err(|e| StartError::Config(format!("invalid URL {url:?}: {e}")))?;
    match parsed.scheme() {
        "http" | "https" => {}
        "unix" | "unixs" => {
            return Err(StartError::Config(format!(
                "unix socket URLs are supported on client URLs only (--listen-client-urls, \
                 --listen-client-http-urls): {url}"
            )));
        }
        other => {
            return Err(StartError::Config(format!(
                "URL scheme must be http, https, unix or unixs: {other}"
            )))
        }
    }
    let host = parsed
        .host_str()
        .ok_or_else(|| StartError::Config(format!("URL has no host: {url}")))?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let port = parsed.port().ok_or_else(|| {
        StartError::Config(format!(
            "URL address does not have the form \"host:port\": {url}"
        ))
    })?;
    let host = if host == "localhost" {
        "127.0.0.1"
    } else {
        host
    };
    (host, port)
        .to_socket_addrs()
        .map_err(|e| StartError::Config(format!("cannot resolve {url}: {e}")))?
        .next()
        .ok_or_else(|| StartError::Config(format!("cannot resolve {url}")))
}

/// A member restarted on a volume that filled up (it stopped on ENOSPC)
/// would replay its log, stop the same way and append WAL records each
/// time: below this much free space it refuses to start, writing nothing.
pub(crate) const MIN_FREE_BYTES_TO_START: u64 = 1 << 20;

/// Refuses a data dir, or a `--wal-dir`, on a full volume; warns when the
/// volume of the WAL cannot hold two WAL segments (the member then stops,
/// whole, when it fills).
pub fn check_volume(cfg: &ServerConfig) -> Result<(), StartError> {
    let holds_wal = cfg.dedicated_wal_dir.is_none();
    check_free_space(&cfg.data_dir, "data-dir", holds_wal)?;
    if let Some(wal_dir) = &cfg.dedicated_wal_dir {
        check_free_space(wal_dir, "wal-dir", true)?;
    }
    Ok(())
}

/// [`check_volume`] for the volume of `dir` (`--data-dir` or
/// `--wal-dir`, as `flag` names it).
fn check_free_space(dir: &Path, flag: &str, holds_wal: bool) -> Result<(), StartError> {
    let probe = dir
        .ancestors()
        .find(|p| p.exists())
        .map_or_else(|| Path::new(".").to_path_buf(), Path::to_path_buf);
    let free = match consensus::wal::free_bytes(&probe) {
        Ok(free) => free,
        Err(e) => {
            tracing::warn!(path = %probe.display(), error = %e, "cannot tell the volume's free space");
            return Ok(());
        }
    };
    if free < MIN_FREE_BYTES_TO_START {
        return Err(StartError::DataDir(format!(
            "no space left on device: the volume holding {} has {free} bytes free, and a member \
             needs at least {MIN_FREE_BYTES_TO_START} to start; free space on it, then start again",
            dir.display()
        )));
    }
    let safe = 2 * consensus::wal::SEGMENT_BYTES;
    if holds_wal && free < safe {
        tracing::warn!(
            path = %dir.display(),
            "volume-free-bytes" = free,
            "safe-free-bytes" = safe,
            "the {flag}'s volume is too small to be safe: less than two WAL segments free; \
             the member stops when it fills"
        );
    }
    Ok(())
}

/// etcd's data dir shape, refusing a dir that holds etcd's own bbolt files.
/// As etcd's NewServer: the data dir, `member/snap` and `member` are
/// touched (created 0700, or warned about when they exist with another
/// mode: never refused), and the WAL dir (`member/wal`, or `--wal-dir`
/// alone: no `member/wal` then) is created 0700.
pub fn prepare_data_dir(cfg: &ServerConfig) -> Result<(), StartError> {
    let member = cfg.member_dir();
    let fail = |dir: &std::path::Path, e: std::io::Error| {
        StartError::DataDir(format!(
            "cannot access data directory {}: {e}",
            dir.display()
        ))
    };
    for dir in [cfg.data_dir.clone(), member.join("snap"), member.clone()] {
        consensus::fileutil::touch_dir_all(&dir).map_err(|e| fail(&dir, e))?;
    }
    let wal = cfg.wal_dir();
    consensus::fileutil::create_private_dir_all(&wal).map_err(|e| {
        StartError::DataDir(format!(
            "cannot access WAL directory {}: {e}",
            wal.display()
        ))
    })?;
    check_backend_is_ours(&cfg.backend_path())
}

/// A `--wal-dir` that holds no WAL while `member/wal` does: the member's
/// log is in the data dir. etcd would start a new member (a new log under
/// the old backend, whose first entries it then skips as applied); oxcd
/// refuses, naming both.
fn check_wal_dir(cfg: &ServerConfig) -> Result<(), StartError> {
    let Some(dedicated) = &cfg.dedicated_wal_dir else {
        return Ok(());
    };
    let in_member = cfg.member_dir().join("wal");
    if dedicated != &in_member
        && !consensus::wal::Wal::exists(dedicated)
        && consensus::wal::Wal::exists(&in_member)
    {
        return Err(StartError::DataDir(format!(
            "--wal-dir {} holds no WAL but {} does: move the member's WAL to the --wal-dir, \
             or start it without --wal-dir",
            dedicated.display(),
            in_member.display()
        )));
    }
    Ok(())
}

pub struct Identity {
    pub member: MemberInfo,
    /// Every member this one knows, itself included.
    pub members: Vec<MemberInfo>,
    pub cluster_id: u64,
    pub voters: Vec<u64>,
    pub restarted: bool,
}

/// The members named by `--initial-cluster`, with etcd's IDs.
pub(crate) fn initial_members(cfg: &ServerConfig) -> Result<Vec<MemberInfo>, StartError> {
    // etcd's NewURLsMap("") is an empty map: a discovery flag without its
    // answer (`--discovery-srv-name` alone) clears --initial-cluster, and
    // the member is then not found in it
    if cfg.initial_cluster.trim().is_empty() {
        return Ok(Vec::new());
    }
    let cluster =
        membership::parse_initial_cluster(&cfg.initial_cluster).map_err(StartError::Config)?;
    Ok(cluster
        .into_iter()
        .map(|(name, urls)| MemberInfo {
            id: membership::member_id(&urls, &cfg.initial_cluster_token),
            client_urls: if name == cfg.name {
                cfg.advertise_client_urls.clone()
            } else {
                Vec::new()
            },
            name,
            peer_urls: urls,
            is_learner: false,
        })
        .collect())
}

/// Who this member is. A member with a WAL takes its IDs and voters from it
/// and ignores the bootstrap token, as etcd does; a new one derives them
/// from `--initial-cluster` and `--initial-cluster-token` as etcd does.
/// Peer URLs come from `--initial-cluster` in both cases (etcd keeps them in
/// its membership store; ours arrives with membership changes).
pub fn identity(cfg: &ServerConfig) -> Result<Identity, StartError> {
    check_backend_is_ours(&cfg.backend_path())?;
    check_wal_dir(cfg)?;
    let wal_dir = cfg.wal_dir();
    let recorded = if wal_dir.exists() {
        consensus::wal::Wal::read_metadata(&wal_dir).map_err(|e| {
            StartError::DataDir(format!("cannot read the WAL in {}: {e}", wal_dir.display()))
        })?
    } else {
        None
    };
    if let Some(meta) = recorded {
        tracing::info!("local-member-id" = %format!("{:x}", meta.node_id), "cluster-id" = %format!("{:x}", meta.cluster_id),
            "restarting local member");
        let by_url: Vec<MemberInfo> = initial_members(cfg).unwrap_or_default();
        let mut members = Vec::new();
        for voter in &meta.initial_voters {
            match by_url.iter().find(|m| m.id == *voter) {
                Some(m) => members.push(m.clone()),
                None if *voter == meta.node_id => {}
                // a discovery bootstrap leaves --initial-cluster empty:
                // the backend's members table has them (known_members)
                None if by_url.is_empty() => {}
                None => tracing::warn!(member = %format!("{voter:x}"),
                    "peer URLs of a member are unknown: --initial-cluster does not name it"),
            }
        }
        let mut member = members
            .iter()
            .find(|m| m.id == meta.node_id)
            .cloned()
            .unwrap_or(MemberInfo {
                id: meta.node_id,
                name: cfg.name.clone(),
                peer_urls: cfg.initial_advertise_peer_urls.clone(),
                client_urls: Vec::new(),
                is_learner: false,
            });
        member.name = cfg.name.clone();
        member.client_urls = cfg.advertise_client_urls.clone();
        members.retain(|m| m.id != member.id);
        members.push(member.clone());
        return Ok(Identity {
            member,
            members,
            cluster_id: meta.cluster_id,
            voters: meta.initial_voters,
            restarted: true,
        });
    }

    if cfg.initial_cluster_state == "existing" {
        return Err(StartError::Config(
            "a member joining a running cluster takes its identity from it: see join_existing"
                .to_string(),
        ));
    }
    let members = initial_members(cfg)?;
    let Some(member) = members.iter().find(|m| m.name == cfg.name).cloned() else {
        return Err(StartError::Config(format!(
            "couldn't find local name {:?} in the initial cluster configuration",
            cfg.name
        )));
    };
    let voters: Vec<u64> = members.iter().map(|m| m.id).collect();
    Ok(Identity {
        cluster_id: membership::cluster_id(&voters),
        member,
        members,
        voters,
        restarted: false,
    })
}

/// etcd's `isMemberInitialized`: the WAL dir exists and holds a file. An
/// initialized member takes its cluster from its data dir, never from
/// `--initial-cluster` or a discovery (DNS SRV records are not asked).
pub fn is_member_initialized(cfg: &ServerConfig) -> bool {
    let wal_dir = cfg.wal_dir();
    std::fs::read_dir(wal_dir).is_ok_and(|mut entries| entries.next().is_some())
}

/// Whether this member joins a running cluster: a new data dir (no WAL)
/// and `--initial-cluster-state existing`.
pub fn joins_existing(cfg: &ServerConfig) -> bool {
    let wal_dir = cfg.wal_dir();
    cfg.initial_cluster_state == "existing"
        && !(wal_dir.exists()
            && matches!(consensus::wal::Wal::read_metadata(&wal_dir), Ok(Some(_))))
}

/// How long a joining member tries each peer for the cluster's membership.
const JOIN_REQUEST_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// A member joining a running cluster (`--initial-cluster-state
/// existing`): asks the members named in `--initial-cluster` for the
/// cluster's membership (etcd's GetClusterFromRemotePeers), checks it as
/// etcd's ValidateClusterAndAssignIDs does (the same number of members,
/// peer URL sets matching one to one), and takes the running cluster's
/// member and cluster IDs. Names are not compared, as in etcd.
pub async fn join_existing(
    cfg: &ServerConfig,
    tls: Option<std::sync::Arc<rustls::ClientConfig>>,
) -> Result<Identity, StartError> {
    check_wal_dir(cfg)?;
    let local = initial_members(cfg)?;
    let Some(me) = local.iter().find(|m| m.name == cfg.name).cloned() else {
        return Err(StartError::Config(format!(
            "couldn't find local name {:?} in the initial cluster configuration",
            cfg.name
        )));
    };
    let mut last_error = String::from("no peer to ask");
    for url in local
        .iter()
        .filter(|m| m.name != cfg.name)
        .flat_map(|m| m.peer_urls.iter())
    {
        let tls = tls.as_ref().filter(|_| url.starts_with("https://"));
        let channel = match consensus::transport::lazy_channel(url, JOIN_REQUEST_TIMEOUT, tls) {
            Ok(channel) => channel,
            Err(e) => {
                last_error = e.to_string();
                continue;
            }
        };
        let mut client =
            api::oxcdpeerpb::membership_peer_client::MembershipPeerClient::new(channel);
        let asked = tokio::time::timeout(
            JOIN_REQUEST_TIMEOUT,
            client.members(api::oxcdpeerpb::MembersRequest {}),
        )
        .await;
        let remote = match asked {
            Ok(Ok(resp)) => resp.into_inner(),
            Ok(Err(status)) => {
                tracing::warn!(remote = %url, error = %status.message(), "failed to get cluster response");
                last_error = status.message().to_string();
                continue;
            }
            Err(_) => {
                tracing::warn!(remote = %url, "failed to get cluster response: timed out");
                last_error = "timed out".to_string();
                continue;
            }
        };
        return assign_ids(cfg, &local, me, remote);
    }
    Err(StartError::Config(format!(
        "cannot fetch cluster info from peer urls: could not retrieve cluster information from the given URLs (last error: {last_error})"
    )))
}

/// etcd's ValidateClusterAndAssignIDs: the local view (`--initial-cluster`)
/// and the running cluster's membership must name the same peer URL sets.
fn assign_ids(
    cfg: &ServerConfig,
    local: &[MemberInfo],
    me: MemberInfo,
    remote: api::oxcdpeerpb::MembersResponse,
) -> Result<Identity, StartError> {
    if local.len() != remote.members.len() {
        return Err(StartError::Config(format!(
            "error validating peerURLs {{ClusterID:{:x} Members:[{}] RemovedMemberIDs:[]}}: member count is unequal",
            remote.cluster_id,
            remote.members.iter().map(|m| format!("&{{ID:{:x} RaftAttributes:{{PeerURLs:[{}] IsLearner:{}}} Attributes:{{Name:{} ClientURLs:[{}]}}}}",
                m.id, m.peer_ur_ls.join(" "), m.is_learner, m.name, m.client_ur_ls.join(" "))).collect::<Vec<_>>().join(" ")
        )));
    }
    let sorted = |urls: &[String]| {
        let mut urls = urls.to_vec();
        urls.sort();
        urls
    };
    let mut members = Vec::with_capacity(local.len());
    let mut taken = std::collections::HashSet::new();
    for l in local {
        let found = remote
            .members
            .iter()
            .find(|r| !taken.contains(&r.id) && sorted(&r.peer_ur_ls) == sorted(&l.peer_urls));
        let Some(r) = found else {
            return Err(StartError::Config(format!(
                "error validating peerURLs: PeerURLs: no match found for existing member ({:x}, [{}]), last resolver error ()",
                l.id,
                l.peer_urls.join(" ")
            )));
        };
        taken.insert(r.id);
        members.push(MemberInfo {
            id: r.id,
            name: r.name.clone(),
            peer_urls: r.peer_ur_ls.clone(),
            client_urls: r.client_ur_ls.clone(),
            is_learner: r.is_learner,
        });
    }
    let own = members
        .iter()
        .find(|m| sorted(&m.peer_urls) == sorted(&me.peer_urls))
        .cloned()
        .expect("every local member matched one");
    let member = MemberInfo {
        name: cfg.name.clone(),
        client_urls: cfg.advertise_client_urls.clone(),
        ..own
    };
    tracing::info!("local-member-id" = %format!("{:x}", member.id), "cluster-id" = %format!("{:x}", remote.cluster_id),
        "remote-version" = %remote.version, "joining an existing cluster");
    Ok(Identity {
        member,
        members,
        cluster_id: remote.cluster_id,
        voters: remote.initial_voters,
        restarted: false,
    })
}

/// The data dir of a backend at `<data-dir>/member/snap/db`.
fn data_dir_of(backend: &Path) -> &Path {
    backend
        .ancestors()
        .nth(3)
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
}

pub(crate) fn check_backend_is_ours(path: &Path) -> Result<(), StartError> {
    use schema::backend_file::{inspect, Kind};
    match inspect(path) {
        Kind::Absent | Kind::Ours => Ok(()),
        Kind::Bbolt => Err(StartError::DataDir(format!(
            "{} is not an oxcd backend (it looks like an etcd bbolt database); oxcd does not open etcd's data files: \
             stop etcd and convert the data dir with `oxctl migrate --data-dir {}` (etcd's files are kept beside it), \
             or restore an etcd snapshot into a fresh oxcd data dir",
            path.display(),
            data_dir_of(path).display()
        ))),
        Kind::Unknown => Err(StartError::DataDir(format!(
            "{} is not an oxcd backend, or its first page is damaged: it does not begin with redb's file magic; \
             restore it from a snapshot or another member",
            path.display()
        ))),
    }
}

/// The members this one knows: the backend's members table once it has
/// one (it survives restarts and carries published attributes), else the
/// bootstrap list, which is then written to it. This member's own entry
/// always takes its current name and advertised client URLs.
pub fn known_members(
    store: &Store,
    bootstrap: Vec<MemberInfo>,
    own: &MemberInfo,
) -> Result<Vec<MemberInfo>, StartError> {
    let stored: Vec<MemberInfo> = store
        .members()?
        .values()
        .filter_map(|b| membership::decode(b))
        .collect();
    let mut members = if stored.is_empty() {
        for m in &bootstrap {
            store.put_member(m.id, Some(membership::encode(m)), store.consistent_index());
        }
        // A new member's list comes from no log entry that a restart could
        // replay: made durable now, it is the member list after a crash
        // too, whatever --initial-cluster then says (etcd keeps it in its
        // store; a --discovery-srv member restarts without one)
        if store.consistent_index() == 0 {
            store.commit(true)?;
        }
        bootstrap
    } else {
        stored
    };
    match members.iter_mut().find(|m| m.id == own.id) {
        Some(m) => {
            m.name = own.name.clone();
            m.client_urls = own.client_urls.clone();
        }
        None => members.push(own.clone()),
    }
    Ok(members)
}

#[cfg(test)]
mod listen_url_tests {
    use super::*;

    fn unix(url: &str) -> PathBuf {
        match parse_listen_url(url) {
            Ok(ListenAddr::Unix(path)) => path,
            other => panic!("{url}: {other:?}"),
        }
    }

    #[test]
    fn unix_url_socket_file_is_host_port_and_path_as_etcds_resolve_url() {
        assert_eq!(unix("unix://localhost:12345"), Path::new("localhost:12345"));
        assert_eq!(
            unix("unixs://localhost:12345"),
            Path::new("localhost:12345")
        );
        assert_eq!(unix("unix:///run/etcd.sock"), Path::new("/run/etcd.sock"));
        assert_eq!(unix("unix://dir/etcd.sock"), Path::new("dir/etcd.sock"));
        assert_eq!(unix("unix://./a%20b"), Path::new("./a b"));
        assert_eq!(unix("unix://etcd"), Path::new("etcd"));
        assert_eq!(unix("unix://localhost:02379"), Path::new("localhost:02379"));
        assert_eq!(
            unix("unix://u@localhost:1/x?q#f"),
            Path::new("localhost:1/x")
        );
        assert!(parse_listen_url("unix://").is_err());
    }

    #[test]
    fn tcp_urls_resolve_and_unix_urls_are_refused_where_only_tcp_is_served() {
        assert_eq!(
            parse_listen_url("http://127.0.0.1:2379").unwrap(),
            ListenAddr::Tcp("127.0.0.1:2379".parse().unwrap())
        );
        assert!(is_tls_url("unixs://localhost:1"));
        assert!(!is_tls_url("unix://localhost:1"));
        let refused = parse_url("unix://localhost:1").unwrap_err().to_string();
        assert!(refused.contains("client URLs only"), "{refused}");
    }
}
