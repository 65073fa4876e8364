//! The parts of a range that etcd's applier does around the index walk:
//! limit planning, mod/create revision filters, sorting, truncation.

use std::cmp::Ordering;

use api::etcdserverpb::range_request::{SortOrder, SortTarget};
use api::etcdserverpb::{RangeRequest, RangeResponse, ResponseHeader};
use api::mvccpb::KeyValue;

use crate::MvccError;

/// Resolves a requested revision (<= 0 = current) against the readable window
/// [compacted, current].
pub(crate) fn resolve_revision(
    requested: i64,
    current: i64,
    compacted: i64,
) -> Result<i64, MvccError> {
    if requested > current {
        return Err(MvccError::FutureRev);
    }
    let revision = if requested <= 0 { current } else { requested };
    if revision < compacted {
        return Err(MvccError::Compacted);
    }
    Ok(revision)
}

fn has_filters(req: &RangeRequest) -> bool {
    req.min_mod_revision != 0
        || req.max_mod_revision != 0
        || req.min_create_revision != 0
        || req.max_create_revision != 0
}

/// The effective sort order: etcd sorts ASCEND when a non-key target is asked
/// with order NONE.
fn sort_order(req: &RangeRequest) -> SortOrder {
    let order = req.sort_order();
    if req.sort_target() != SortTarget::Key && order == SortOrder::None {
        SortOrder::Ascend
    } else {
        order
    }
}

/// How many keys the index walk must return (0 = all). The walk yields keys in
/// ascending key order, so only a key-ascending result without filters can be
/// cut there (one extra to learn `more`); anything else is fetched whole,
/// filtered and sorted, then truncated.
pub(crate) fn fetch_limit(req: &RangeRequest) -> usize {
    let key_order = req.sort_target() == SortTarget::Key && sort_order(req) != SortOrder::Descend;
    if req.limit <= 0 || has_filters(req) || !key_order {
        0
    } else {
        usize::try_from(req.limit)
            .unwrap_or(usize::MAX)
            .saturating_add(1)
    }
}

/// Applies filters, sort, limit and keys_only to the walked kvs (in key
/// order) and builds the response.
pub(crate) fn finish(
    req: &RangeRequest,
    mut kvs: Vec<KeyValue>,
    count: usize,
    header_revision: i64,
) -> RangeResponse {
    if req.max_mod_revision != 0 {
        kvs.retain(|kv| kv.mod_revision <= req.max_mod_revision);
    }
    if req.min_mod_revision != 0 {
        kvs.retain(|kv| kv.mod_revision >= req.min_mod_revision);
    }
    if req.max_create_revision != 0 {
        kvs.retain(|kv| kv.create_revision <= req.max_create_revision);
    }
    if req.min_create_revision != 0 {
        kvs.retain(|kv| kv.create_revision >= req.min_create_revision);
    }
    let order = sort_order(req);
    if order != SortOrder::None {
        let compare: fn(&KeyValue, &KeyValue) -> Ordering = match req.sort_target() {
            SortTarget::Key => |a, b| a.key.cmp(&b.key),
            SortTarget::Version => |a, b| a.version.cmp(&b.version),
            SortTarget::Create => |a, b| a.create_revision.cmp(&b.create_revision),
            SortTarget::Mod => |a, b| a.mod_revision.cmp(&b.mod_revision),
            SortTarget::Value => |a, b| a.value.cmp(&b.value),
        };
        if order == SortOrder::Descend {
            kvs.sort_by(|a, b| compare(b, a));
        } else {
            kvs.sort_by(compare);
        }
    }
    let mut more = false;
    if req.limit > 0 && kvs.len() as u64 > req.limit as u64 {
        kvs.truncate(req.limit as usize);
        more = true;
    }
    if req.keys_only {
        for kv in &mut kvs {
            kv.value = Default::default();
        }
    }
    RangeResponse {
        header: Some(header(header_revision)),
        kvs,
        more,
        count: count as i64,
    }
}

pub(crate) fn header(revision: i64) -> ResponseHeader {
    ResponseHeader {
        revision,
        ..Default::default()
    }
}
