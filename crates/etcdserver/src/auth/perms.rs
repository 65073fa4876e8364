//! A user's merged key permissions (etcd's unifiedRangePermissions): the
//! union of its roles' READ and WRITE grants as sorted intervals, and
//! etcd's two checks on them — a single key must fall inside some grant
//! (checkKeyPoint), a range must be covered by the grants without a gap
//! (checkKeyInterval, the interval tree's Contains).
//!
//! Bounds follow etcd's BytesAffineComparable: an empty end is +∞. A grant
//! on one key is the interval `[key, key\0)`; a grant whose range_end is
//! `\0` runs from its key to +∞, as does a request whose range_end is `\0`.

use api::authpb::{permission::Type as PermType, Role};

/// The end of an interval; `None` is +∞.
type End = Option<Vec<u8>>;

fn end_lt(a: &End, b: &End) -> bool {
    match (a, b) {
        (_, None) => a.is_some(),
        (None, Some(_)) => false,
        (Some(a), Some(b)) => a < b,
    }
}

/// `key < end` with `end` possibly +∞.
fn below(key: &[u8], end: &End) -> bool {
    end.as_ref().is_none_or(|e| key < e.as_slice())
}

#[derive(Debug, Default, Clone)]
struct Intervals(Vec<(Vec<u8>, End)>);

impl Intervals {
    fn insert(&mut self, begin: Vec<u8>, end: End) {
        self.0.push((begin, end));
    }

    fn seal(&mut self) {
        self.0.sort();
    }

    /// A grant holds `key` (checkKeyPoint: the point `[key, key\0)`
    /// intersects a grant).
    fn holds(&self, key: &[u8]) -> bool {
        self.0
            .iter()
            .any(|(b, e)| b.as_slice() <= key && below(key, e))
    }

    /// The grants cover `[begin, end)` without a gap (adt's Contains: the
    /// grants overlapping it, in begin order, must chain from at or before
    /// `begin` to at or past `end`).
    fn covers(&self, begin: &[u8], end: &End) -> bool {
        let mut reach: Option<&End> = None;
        let mut first: Option<&[u8]> = None;
        for (b, e) in &self.0 {
            // Overlaps [begin, end): b < end && begin < e.
            if !below(b, end) || !below(begin, e) {
                continue;
            }
            match reach {
                None => {
                    first = Some(b);
                    reach = Some(e);
                }
                Some(r) => {
                    // A gap: the chain so far ends before this grant begins.
                    if r.as_ref().is_some_and(|r| r.as_slice() < b.as_slice()) {
                        return false;
                    }
                    if end_lt(r, e) {
                        reach = Some(e);
                    }
                }
            }
        }
        match (first, reach) {
            (Some(first), Some(reach)) => first <= begin && !end_lt(reach, end),
            _ => false,
        }
    }
}

/// What one user may read and write.
#[derive(Debug, Default, Clone)]
pub struct UserPermissions {
    read: Intervals,
    write: Intervals,
}

/// The kind of access a request needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    Read,
    Write,
}

impl UserPermissions {
    /// The union of `roles`' grants.
    pub fn merge<'r>(roles: impl IntoIterator<Item = &'r Role>) -> UserPermissions {
        let mut perms = UserPermissions::default();
        for role in roles {
            for perm in &role.key_permission {
                let (begin, end) = grant_interval(&perm.key, &perm.range_end);
                match PermType::try_from(perm.perm_type) {
                    Ok(PermType::Read) => perms.read.insert(begin, end),
                    Ok(PermType::Write) => perms.write.insert(begin, end),
                    Ok(PermType::Readwrite) => {
                        perms.read.insert(begin.clone(), end.clone());
                        perms.write.insert(begin, end);
                    }
                    Err(_) => {}
                }
            }
        }
        perms.read.seal();
        perms.write.seal();
        perms
    }

    /// etcd's isRangeOpPermitted: one key (empty `range_end`) must be held
    /// by a grant; a range must be covered whole.
    pub fn permits(&self, access: Access, key: &[u8], range_end: &[u8]) -> bool {
        let grants = match access {
            Access::Read => &self.read,
            Access::Write => &self.write,
        };
        if range_end.is_empty() {
            return grants.holds(key);
        }
        let end = if range_end == [0] {
            None
        } else {
            Some(range_end.to_vec())
        };
        grants.covers(key, &end)
    }
}

/// The interval a grant covers.
fn grant_interval(key: &[u8], range_end: &[u8]) -> (Vec<u8>, End) {
    if range_end.is_empty() {
        let mut next = key.to_vec();
        next.push(0);
        (key.to_vec(), Some(next))
    } else if range_end == [0] {
        (key.to_vec(), None)
    } else {
        (key.to_vec(), Some(range_end.to_vec()))
    }
}

/// etcd's isValidPermissionRange: a key, and an end that is empty (one
/// key), `\0` (from the key on) or after the key.
pub fn valid_grant(key: &[u8], range_end: &[u8]) -> bool {
    !key.is_empty() && (range_end.is_empty() || range_end == [0] || key < range_end)
}

#[cfg(test)]
mod tests {
    use super::*;
    use api::authpb::Permission;

    fn role(perms: &[(PermType, &str, &str)]) -> Role {
        Role {
            name: b"r".to_vec().into(),
            key_permission: perms
                .iter()
                .map(|(t, k, e)| Permission {
                    perm_type: *t as i32,
                    key: k.as_bytes().to_vec().into(),
                    range_end: e.as_bytes().to_vec().into(),
                })
                .collect(),
        }
    }

    #[test]
    fn one_key_grant_holds_that_key_only() {
        let p = UserPermissions::merge([&role(&[(PermType::Read, "foo", "")])]);
        assert!(p.permits(Access::Read, b"foo", b""));
        assert!(!p.permits(Access::Read, b"foo1", b""));
        assert!(!p.permits(Access::Write, b"foo", b""));
        // The range holding exactly that key is covered.
        assert!(p.permits(Access::Read, b"foo", b"foo\0"));
        assert!(!p.permits(Access::Read, b"foo", b"fop"));
    }

    #[test]
    fn ranges_cover_only_without_gaps() {
        let p = UserPermissions::merge([
            &role(&[(PermType::Readwrite, "a", "c")]),
            &role(&[(PermType::Read, "c", "e"), (PermType::Read, "f", "g")]),
        ]);
        assert!(p.permits(Access::Read, b"a", b"e"));
        assert!(p.permits(Access::Read, b"b", b"d"));
        assert!(!p.permits(Access::Read, b"a", b"f\0"), "gap [e, f)");
        assert!(p.permits(Access::Write, b"a", b"c"));
        assert!(!p.permits(Access::Write, b"a", b"d"));
        assert!(
            !p.permits(Access::Read, b"0", b"b"),
            "starts before the grant"
        );
        assert!(
            !p.permits(Access::Read, b"a", b"\0"),
            "open end not covered"
        );
        assert!(p.permits(Access::Read, b"f", b""));
        assert!(!p.permits(Access::Read, b"e", b""));
    }

    #[test]
    fn from_key_grants_reach_infinity() {
        let p = UserPermissions::merge([&role(&[(PermType::Write, "k", "\0")])]);
        assert!(p.permits(Access::Write, b"k", b"\0"));
        assert!(p.permits(Access::Write, b"zzz", b""));
        assert!(p.permits(Access::Write, b"l", b"m"));
        assert!(!p.permits(Access::Write, b"j", b"\0"));
        let all = UserPermissions::merge([&role(&[(PermType::Read, "\0", "\0")])]);
        assert!(all.permits(Access::Read, b"\0", b"\0"));
        assert!(all.permits(Access::Read, b"anything", b""));
    }

    #[test]
    fn reversed_ranges_and_empty_grants_as_etcd() {
        // etcd's tree compares a reversed range by its bounds: covered when
        // one grant spans both (it selects nothing anyway).
        let p = UserPermissions::merge([&role(&[(PermType::Read, "a", "z")])]);
        assert!(p.permits(Access::Read, b"m", b"c"));
        let p = UserPermissions::merge([&role(&[(PermType::Read, "n", "z")])]);
        assert!(!p.permits(Access::Read, b"m", b"c"));
        assert!(!UserPermissions::default().permits(Access::Read, b"a", b""));
    }

    #[test]
    fn grants_are_validated_as_etcd() {
        assert!(valid_grant(b"a", b""));
        assert!(valid_grant(b"a", b"\0"));
        assert!(valid_grant(b"a", b"b"));
        assert!(!valid_grant(b"b", b"a"));
        assert!(!valid_grant(b"a", b"a"));
        assert!(!valid_grant(b"", b""));
    }
}
