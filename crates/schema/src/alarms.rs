//! Alarms: the `alarm` table's records (etcd's AlarmMember message).

use api::etcdserverpb::AlarmMember;
use prost::Message;

/// The side-table key of an alarm: the member's low 56 bits and the type.
/// The record holds the full AlarmMember, so the key only has to be unique
/// among the few alarms a cluster has.
pub fn record_key(member: u64, alarm: i32) -> u64 {
    (member & 0x00ff_ffff_ffff_ffff) | ((alarm as u64 & 0xff) << 56)
}

pub fn encode(member: u64, alarm: i32) -> Vec<u8> {
    AlarmMember {
        member_id: member,
        alarm,
    }
    .encode_to_vec()
}

pub fn decode(record: &[u8]) -> Result<AlarmMember, prost::DecodeError> {
    AlarmMember::decode(record)
}
