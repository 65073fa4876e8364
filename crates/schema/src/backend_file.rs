//! Telling a backend file from others by its first bytes: ours (a redb
//! file), etcd's (a bbolt file), or neither (not a backend, or a damaged
//! first page). Neither the member nor oxctl opens etcd's files.

use std::io::Read;
use std::path::Path;

/// redb's file magic: every redb file begins with it.
pub const REDB_MAGIC: &[u8] = b"redb\x1a\x0a\xa9\x0d\x0a";
/// bbolt's meta magic, at offset 16 of its first page (after the page
/// header), little-endian.
pub const BBOLT_MAGIC: u32 = 0xED0C_DAED;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// No file, or an empty one (what a crash during creation leaves).
    Absent,
    /// A redb file: ours.
    Ours,
    /// An etcd bbolt file.
    Bbolt,
    /// Neither: not a backend, or its first page is damaged.
    Unknown,
}

pub fn inspect(path: &Path) -> Kind {
    let Ok(mut file) = std::fs::File::open(path) else {
        return Kind::Absent;
    };
    let mut head = [0u8; 20];
    let mut read = 0;
    while read < head.len() {
        match file.read(&mut head[read..]) {
            Ok(0) | Err(_) => break,
            Ok(n) => read += n,
        }
    }
    if read == 0 {
        return Kind::Absent;
    }
    if read >= REDB_MAGIC.len() && head[..REDB_MAGIC.len()] == *REDB_MAGIC {
        return Kind::Ours;
    }
    if read == head.len() && head[16..20] == BBOLT_MAGIC.to_le_bytes() {
        return Kind::Bbolt;
    }
    Kind::Unknown
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_are_told_apart_by_their_first_bytes() {
        let dir = std::env::temp_dir().join(format!("schema-backend-file-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("db");
        assert_eq!(inspect(&path), Kind::Absent);
        std::fs::write(&path, b"").unwrap();
        assert_eq!(inspect(&path), Kind::Absent);
        let mut redb = REDB_MAGIC.to_vec();
        redb.resize(4096, 0);
        std::fs::write(&path, &redb).unwrap();
        assert_eq!(inspect(&path), Kind::Ours);
        let mut bbolt = vec![0u8; 4096];
        bbolt[16..20].copy_from_slice(&BBOLT_MAGIC.to_le_bytes());
        std::fs::write(&path, &bbolt).unwrap();
        assert_eq!(inspect(&path), Kind::Bbolt);
        std::fs::write(&path, [0xa5u8; 64]).unwrap();
        assert_eq!(inspect(&path), Kind::Unknown);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
