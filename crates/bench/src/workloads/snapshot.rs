//! `snapshot`: not an etcd benchmark command but a probe of how fast a
//! member streams Maintenance.Snapshot to a client that only reads it. With
//! `etcdctl snapshot save` the client's own work (decode, write, fsync) is
//! part of the time; this reader keeps the member the bound. It checks what it
//! read: the database's bytes add up to the first message's blob plus its
//! `remaining_bytes` (which count the database only), the last message says
//! 0 remaining, a 32-byte sha256 follows the database (etcd sends it as one
//! more message) and, with `--verify`, it matches the bytes before it.

use std::time::Instant;

use api::etcdserverpb::maintenance_client::MaintenanceClient;
use api::etcdserverpb::SnapshotRequest;
use sha2::{Digest as _, Sha256};

use crate::client::{status_message, Settings};

/// The sha256 etcd appends to the database's bytes.
const HASH_LEN: usize = 32;

/// What one stream carried.
#[derive(Debug, Default)]
pub struct Tally {
    /// Bytes of every blob, the trailing hash included.
    pub bytes: u64,
    pub messages: u64,
    /// The first message's blob plus its `remaining_bytes`: the database's
    /// size as the member announced it (the trailing hash not counted).
    announced: Option<u64>,
    last_remaining: Option<u64>,
    /// The last HASH_LEN bytes seen, and the hash of everything before them.
    tail: Vec<u8>,
    hasher: Option<Sha256>,
}

impl Tally {
    pub fn new(verify: bool) -> Self {
        Tally {
            hasher: verify.then(Sha256::new),
            ..Default::default()
        }
    }

    pub fn add(&mut self, blob: &[u8], remaining: u64) {
        if self.announced.is_none() {
            self.announced = Some(blob.len() as u64 + remaining);
        }
        self.bytes += blob.len() as u64;
        self.messages += 1;
        self.last_remaining = Some(remaining);
        if let Some(hasher) = &mut self.hasher {
            // hash all but the last HASH_LEN bytes seen so far
            self.tail.extend_from_slice(blob);
            let settled = self.tail.len().saturating_sub(HASH_LEN);
            hasher.update(&self.tail[..settled]);
            self.tail.drain(..settled);
        }
    }

    /// Ok once the stream was whole (and its hash matched, if checked).
    pub fn check(self) -> Result<(), String> {
        match (self.announced, self.last_remaining) {
            (Some(announced), Some(0)) if announced + HASH_LEN as u64 == self.bytes => {}
            (announced, last) => {
                return Err(format!(
                    "snapshot stream incomplete: {} bytes read, {announced:?} announced, \
                     {last:?} remaining in the last message",
                    self.bytes
                ))
            }
        }
        if let Some(hasher) = self.hasher {
            if self.tail.len() != HASH_LEN || hasher.finalize().as_slice() != self.tail.as_slice() {
                return Err("snapshot stream: sha256 mismatch".into());
            }
        }
        Ok(())
    }
}

/// Streams one snapshot from the first endpoint; prints its size, time and
/// rate.
pub async fn run(settings: &Settings, verify: bool) -> Result<(), String> {
    let endpoint = settings.endpoints[0].clone();
    let connection = settings.connection().await?;
    let start = Instant::now();
    let mut stream = MaintenanceClient::new(connection)
        .snapshot(SnapshotRequest {})
        .await
        .map_err(|s| status_message(&s))?
        .into_inner();
    let mut tally = Tally::new(verify);
    let mut first_byte = None;
    while let Some(message) = stream.message().await.map_err(|s| status_message(&s))? {
        first_byte.get_or_insert_with(|| start.elapsed().as_secs_f64());
        tally.add(&message.blob, message.remaining_bytes);
    }
    let secs = start.elapsed().as_secs_f64();
    let (bytes, messages) = (tally.bytes, tally.messages);
    tally.check()?;
    let mb_per_s = bytes as f64 / 1e6 / secs.max(1e-9);
    let first_byte = first_byte.unwrap_or(secs);
    if settings.json {
        println!(
            "{}",
            serde_json::json!({"endpoint": endpoint, "bytes": bytes, "messages": messages,
                               "secs": secs, "first_byte_secs": first_byte, "mb_per_s": mb_per_s,
                               "verified": verify})
        );
    } else {
        println!(
            "{endpoint}: {bytes} bytes in {messages} messages, {secs:.3} secs \
             ({mb_per_s:.1} MB/s, first byte after {first_byte:.3} secs)"
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// etcd's stream: the database in chunks, `remaining_bytes` counting
    /// the database only, then its sha256 as one more message.
    fn stream(db: &[u8], hash: &[u8], chunk: usize) -> Vec<(Vec<u8>, u64)> {
        let mut out = Vec::new();
        let mut sent = 0;
        for piece in db.chunks(chunk) {
            sent += piece.len();
            out.push((piece.to_vec(), (db.len() - sent) as u64));
        }
        out.push((hash.to_vec(), 0));
        out
    }

    fn tally(messages: &[(Vec<u8>, u64)], verify: bool) -> Result<(), String> {
        let mut tally = Tally::new(verify);
        for (blob, remaining) in messages {
            tally.add(blob, *remaining);
        }
        tally.check()
    }

    #[test]
    fn a_whole_stream_checks_out_for_every_chunking() {
        let db: Vec<u8> = (0..10_000u32).map(|i| (i * 7) as u8).collect();
        let hash = Sha256::digest(&db);
        for chunk in [1, 5, 31, 32, 33, 4096, db.len()] {
            assert_eq!(
                tally(&stream(&db, &hash, chunk), true),
                Ok(()),
                "chunk {chunk}"
            );
            assert_eq!(
                tally(&stream(&db, &hash, chunk), false),
                Ok(()),
                "chunk {chunk}"
            );
        }
    }

    #[test]
    fn a_short_stream_or_a_wrong_hash_is_refused() {
        let db = b"a database".to_vec();
        let hash = Sha256::digest(&db);
        let incomplete = |messages: &[(Vec<u8>, u64)]| {
            tally(messages, false).unwrap_err().contains("incomplete")
        };
        let mut messages = stream(&db, &hash, 4);
        messages.pop();
        assert!(incomplete(&messages), "no hash");
        messages.remove(0);
        assert!(incomplete(&messages), "no first chunk");
        assert!(incomplete(&[]), "nothing");
        let mut bad = db.clone();
        bad[0] ^= 1;
        assert_eq!(tally(&stream(&bad, &hash, 4), false), Ok(()));
        let refused = tally(&stream(&bad, &hash, 4), true).unwrap_err();
        assert!(refused.contains("sha256"), "{refused}");
    }
}
