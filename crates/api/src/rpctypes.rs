//! etcd's client-visible errors: the gRPC code and message of every one,
//! as etcd's api/v3rpc/rpctypes/error.go defines them. Clients (clientv3,
//! etcdctl, kube-apiserver) match on these exact strings.

use tonic::{Code, Status};

/// One etcd error: its gRPC code and its exact message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EtcdError {
    pub code: Code,
    pub message: &'static str,
}

impl EtcdError {
    pub fn status(self) -> Status {
        Status::new(self.code, self.message)
    }
}

impl From<EtcdError> for Status {
    fn from(e: EtcdError) -> Status {
        e.status()
    }
}

impl std::fmt::Display for EtcdError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.message)
    }
}

impl std::error::Error for EtcdError {}

macro_rules! etcd_errors {
    ($($name:ident => $code:ident, $msg:literal;)*) => {
        $(pub const $name: EtcdError = EtcdError { code: Code::$code, message: $msg };)*
        /// Every error above, for lookups by message.
        pub const ALL: &[EtcdError] = &[$($name),*];
    };
}

etcd_errors! {
    EMPTY_KEY => InvalidArgument, "etcdserver: key is not provided";
    KEY_NOT_FOUND => InvalidArgument, "etcdserver: key not found";
    VALUE_PROVIDED => InvalidArgument, "etcdserver: value is provided";
    LEASE_PROVIDED => InvalidArgument, "etcdserver: lease is provided";
    TOO_MANY_OPS => InvalidArgument, "etcdserver: too many operations in txn request";
    DUPLICATE_KEY => InvalidArgument, "etcdserver: duplicate key given in txn request";
    COMPACTED => OutOfRange, "etcdserver: mvcc: required revision has been compacted";
    FUTURE_REV => OutOfRange, "etcdserver: mvcc: required revision is a future revision";
    NO_SPACE => ResourceExhausted, "etcdserver: mvcc: database space exceeded";
    LEASE_NOT_FOUND => NotFound, "etcdserver: requested lease not found";
    LEASE_EXIST => FailedPrecondition, "etcdserver: lease already exists";
    LEASE_T_T_L_TOO_LARGE => OutOfRange, "etcdserver: too large lease TTL";
    WATCH_CANCELED => Cancelled, "etcdserver: watch canceled";
    MEMBER_EXIST => FailedPrecondition, "etcdserver: member ID already exist";
    PEER_U_R_L_EXIST => FailedPrecondition, "etcdserver: Peer URLs already exists";
    // error.go gives it FailedPrecondition, but the server sends the
    // client-side EtcdError (v3rpc/util.go), which has no gRPC status: the
    // code on the wire is Unknown
    MEMBER_NOT_ENOUGH_STARTED => Unknown, "etcdserver: re-configuration failed due to not enough started members";
    MEMBER_BAD_U_R_LS => InvalidArgument, "etcdserver: given member URLs are invalid";
    MEMBER_NOT_FOUND => NotFound, "etcdserver: member not found";
    MEMBER_NOT_LEARNER => FailedPrecondition, "etcdserver: can only promote a learner member";
    LEARNER_NOT_READY => FailedPrecondition, "etcdserver: can only promote a learner member which is in sync with leader";
    TOO_MANY_LEARNERS => FailedPrecondition, "etcdserver: too many learner members in cluster";
    REQUEST_TOO_LARGE => InvalidArgument, "etcdserver: request is too large";
    REQUEST_TOO_MANY_REQUESTS => ResourceExhausted, "etcdserver: too many requests";
    ROOT_USER_NOT_EXIST => FailedPrecondition, "etcdserver: root user does not exist";
    ROOT_ROLE_NOT_EXIST => FailedPrecondition, "etcdserver: root user does not have root role";
    USER_ALREADY_EXIST => FailedPrecondition, "etcdserver: user name already exists";
    USER_EMPTY => InvalidArgument, "etcdserver: user name is empty";
    USER_NOT_FOUND => FailedPrecondition, "etcdserver: user name not found";
    ROLE_ALREADY_EXIST => FailedPrecondition, "etcdserver: role name already exists";
    ROLE_NOT_FOUND => FailedPrecondition, "etcdserver: role name not found";
    ROLE_EMPTY => InvalidArgument, "etcdserver: role name is empty";
    AUTH_FAILED => InvalidArgument, "etcdserver: authentication failed, invalid user ID or password";
    PERMISSION_DENIED => PermissionDenied, "etcdserver: permission denied";
    ROLE_NOT_GRANTED => FailedPrecondition, "etcdserver: role is not granted to the user";
    PERMISSION_NOT_GRANTED => FailedPrecondition, "etcdserver: permission is not granted to the role";
    AUTH_NOT_ENABLED => FailedPrecondition, "etcdserver: authentication is not enabled";
    INVALID_AUTH_TOKEN => Unauthenticated, "etcdserver: invalid auth token";
    PERMISSION_NOT_GIVEN => InvalidArgument, "etcdserver: permission not given";
    INVALID_AUTH_MGMT => InvalidArgument, "etcdserver: invalid auth management";
    AUTH_OLD_REVISION => InvalidArgument, "etcdserver: revision of auth store is old";
    NO_LEADER => Unavailable, "etcdserver: no leader";
    NOT_LEADER => FailedPrecondition, "etcdserver: not leader";
    LEADER_CHANGED => Unavailable, "etcdserver: leader changed";
    NOT_CAPABLE => Unavailable, "etcdserver: not capable";
    STOPPED => Unavailable, "etcdserver: server stopped";
    TIMEOUT => Unavailable, "etcdserver: request timed out";
    TIMEOUT_DUE_TO_LEADER_FAIL => Unavailable, "etcdserver: request timed out, possibly due to previous leader failure";
    TIMEOUT_DUE_TO_CONNECTION_LOST => Unavailable, "etcdserver: request timed out, possibly due to connection lost";
    TIMEOUT_WAIT_APPLIED_INDEX => Unavailable, "etcdserver: request timed out, waiting for the applied index took too long";
    TIMEOUT_LEADER_TRANSFER => Unavailable, "etcdserver: request timed out, leader transfer took too long";
    UNHEALTHY => Unavailable, "etcdserver: unhealthy cluster";
    CORRUPT => DataLoss, "etcdserver: corrupt cluster";
    NOT_SUPPORTED_FOR_LEARNER => Unavailable, "etcdserver: rpc not supported for learner";
    BAD_LEADER_TRANSFEREE => FailedPrecondition, "etcdserver: bad leader transferee";
    INVALID_SORT_OPTION => InvalidArgument, "etcdserver: invalid sort option";
    // Not in etcd's gRPC error map: they go out with code Unknown and the
    // auth package's prefix, as etcd sends them.
    NO_PASSWORD_USER => Unknown, "auth: authentication failed, password was given for no password user";
    VERIFY_ONLY_KEY => Unknown, "auth: token signing attempted with verify-only key";
}
