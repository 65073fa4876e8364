//! gRPC channels to other members' peer listeners, for the requests a
//! member sends a peer outside raft (lease renewals forwarded to the
//! leader, hashes for corruption checks). One lazily connected channel per
//! member, replaced if the member's peer URL changes.

use std::collections::HashMap;
use std::time::Duration;

use parking_lot::Mutex;
use tonic::transport::Channel;

use crate::membership::ClusterMembers;

/// A connection attempt to a peer gives up after this.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

#[derive(Default)]
pub(crate) struct PeerChannels {
    channels: Mutex<HashMap<u64, (String, Channel)>>,
    /// TLS to `https://` peer URLs (the member's peer client side).
    pub(crate) tls: std::sync::OnceLock<std::sync::Arc<rustls::ClientConfig>>,
}

impl PeerChannels {
    /// The channel to `member`'s first peer URL; None if it has none.
    pub(crate) fn channel(&self, members: &ClusterMembers, member: u64) -> Option<Channel> {
        let url = members.get(member)?.peer_urls.first()?.clone();
        let mut channels = self.channels.lock();
        if let Some((known, channel)) = channels.get(&member) {
            if *known == url {
                return Some(channel.clone());
            }
        }
        let tls = self.tls.get().filter(|_| url.starts_with("https://"));
        let channel = consensus::transport::lazy_channel(&url, CONNECT_TIMEOUT, tls).ok()?;
        channels.insert(member, (url, channel.clone()));
        Some(channel)
    }
}
