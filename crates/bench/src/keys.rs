//! Keys as etcd's benchmark makes them: a zero-filled buffer of `--key-size`
//! bytes holding Go's `binary.PutVarint` (zig-zag varint) of the key index.

/// Zig-zag varint of `value` written at the start of a zeroed `size`-byte key.
/// `None` when the varint does not fit (etcd's benchmark would panic).
pub fn varint_key(size: usize, value: i64) -> Option<Vec<u8>> {
    let mut key = vec![0u8; size];
    let mut zigzag = ((value << 1) ^ (value >> 63)) as u64;
    let mut i = 0;
    loop {
        let byte = key.get_mut(i)?;
        if zigzag < 0x80 {
            *byte = zigzag as u8;
            return Some(key);
        }
        *byte = (zigzag as u8) | 0x80;
        zigzag >>= 7;
        i += 1;
    }
}

/// Check up front that every key index below `key_space` fits in `size` bytes.
pub fn check_key_space(size: usize, key_space: u64) -> Result<(), String> {
    let largest = key_space.saturating_sub(1) as i64;
    match varint_key(size, largest) {
        Some(_) => Ok(()),
        None => Err(format!(
            "--key-size {size} is too small to hold the varint of key index {largest} (--key-space-size {key_space})"
        )),
    }
}

pub fn random_bytes(size: usize) -> Vec<u8> {
    let mut value = vec![0u8; size];
    fastrand::fill(&mut value);
    value
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varint_matches_go_put_varint() {
        assert_eq!(varint_key(4, 0), Some(vec![0, 0, 0, 0]));
        assert_eq!(varint_key(4, 1), Some(vec![2, 0, 0, 0]));
        assert_eq!(varint_key(4, -1), Some(vec![1, 0, 0, 0]));
        assert_eq!(varint_key(4, 64), Some(vec![0x80, 0x01, 0, 0]));
        assert_eq!(varint_key(1, 64), None);
        assert!(check_key_space(8, 1_000_000).is_ok());
        assert!(check_key_space(1, 1000).is_err());
    }
}
