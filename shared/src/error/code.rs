//! THE error table: every [`ErrorCode`] with its name, HTTP status, gRPC
//! code, etcd text and retry class, in one place.
//!
//! Rules the table keeps (each is checked by a test below):
//! - every etcd error text latchkey sends appears in exactly one row, so a
//!   status from any etcd-compatible server maps back to one code;
//! - the etcd text and gRPC code of a row are etcd's own
//!   (`api/v3rpc/rpctypes/error.go`): etcd clients recognise errors by the
//!   text and retry by the code;
//! - the name is the stable identity of a code. It is the `error` field of
//!   the HTTP body, the `latchkey-error` gRPC metadata and the peer-wire
//!   encoding, so a name never changes and is never reused. Rows may be
//!   added and reordered freely: nothing depends on their position.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;
use tonic::Code;

/// What a caller may do after an error. A proxy retries by this class only.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Retry {
    /// Nothing happened: the request was refused before it could take
    /// effect. Retry anywhere (another member, another endpoint).
    Safe,
    /// The request may have taken effect. A write must never be resent
    /// blindly (a compare-and-swap applied twice is a different history);
    /// a caller that knows its request is a read may retry it.
    OutcomeUnknown,
    /// A verdict on the request itself: sending it again gets the same
    /// answer.
    Never,
}

impl Retry {
    /// The class as the HTTP body shows it.
    pub fn as_str(self) -> &'static str {
        match self {
            Retry::Safe => "safe",
            Retry::OutcomeUnknown => "outcome_unknown",
            Retry::Never => "never",
        }
    }
}

/// One row of the error table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ErrorWire {
    /// The stable `snake_case` name.
    pub name: &'static str,
    pub http_status: u16,
    pub grpc_code: Code,
    /// etcd's own error text; `None` where etcd has no such error.
    pub etcd_text: Option<&'static str>,
    pub retry: Retry,
}

/// Declares [`ErrorCode`], [`ErrorCode::ALL`] and [`ErrorCode::wire`] from
/// one list of rows, so a code cannot exist without its row or be missing
/// from `ALL`.
macro_rules! error_table {
    ($(
        $(#[$doc:meta])*
        $variant:ident => $name:literal, $http:literal, $grpc:ident, $text:expr, $retry:ident;
    )*) => {
        /// Stable error codes. See the module documentation for the rules
        /// of the table.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum ErrorCode {
            $( $(#[$doc])* $variant, )*
        }

        impl ErrorCode {
            /// Every code, in table order.
            pub const ALL: &'static [ErrorCode] = &[$(ErrorCode::$variant,)*];

            /// THE table: code -> name, HTTP status, gRPC code, etcd text,
            /// retry class.
            pub const fn wire(self) -> ErrorWire {
                match self {
                    $(ErrorCode::$variant => ErrorWire {
                        name: $name,
                        http_status: $http,
                        grpc_code: Code::$grpc,
                        etcd_text: $text,
                        retry: Retry::$retry,
                    },)*
                }
            }
        }
    };
}

error_table! {
    // --- sessions and leases ---
    /// A session's lease is gone (expired or revoked): the session is over.
    /// etcd has no such error; over etcd's own API it is `lease_not_found`.
    SessionExpired => "session_expired", 404, NotFound, None, Never;
    LeaseNotFound => "lease_not_found", 404, NotFound,
        Some("etcdserver: requested lease not found"), Never;
    LeaseExists => "lease_exists", 409, FailedPrecondition,
        Some("etcdserver: lease already exists"), Never;
    LeaseTtlTooLarge => "lease_ttl_too_large", 400, OutOfRange,
        Some("etcdserver: too large lease TTL"), Never;

    // --- leadership ---
    /// This member does not lead; `Detail::NotLeader` names the leader
    /// when known. Nothing was proposed.
    NotLeader => "not_leader", 503, FailedPrecondition,
        Some("etcdserver: not leader"), Safe;
    /// No leader is known (an election is running). Nothing was proposed.
    NoLeader => "no_leader", 503, Unavailable,
        Some("etcdserver: no leader"), Safe;
    /// Raft on this member has stopped: the member is broken and should be
    /// ejected. A write may have been appended before it stopped.
    MemberStopped => "member_stopped", 503, Unavailable,
        Some("etcdserver: server stopped"), OutcomeUnknown;

    // --- revisions ---
    /// `Detail::Compacted` carries the compact revision.
    Compacted => "compacted", 410, OutOfRange,
        Some("etcdserver: mvcc: required revision has been compacted"), Never;
    FutureRevision => "future_revision", 400, OutOfRange,
        Some("etcdserver: mvcc: required revision is a future revision"), Never;

    // --- request checks ---
    PreconditionFailed => "precondition_failed", 412, FailedPrecondition, None, Never;
    LockTimeout => "lock_timeout", 408, DeadlineExceeded, None, Never;
    /// A Proclaim or Resign by a leader key that no longer leads. etcd
    /// sends its election errors as plain errors (gRPC Unknown).
    ElectionNotLeader => "election_not_leader", 412, Unknown,
        Some("election: not leader"), Never;
    /// A Leader query on an election nobody campaigns in.
    ElectionNoLeader => "election_no_leader", 404, Unknown,
        Some("election: no leader"), Never;
    /// Past the keyspace's quota or a tenant's: HTTP 429, as gRPC's ResourceExhausted
    /// maps to it (not a server error: the client asked for more than it
    /// may have). Not retried: room comes only from deletes.
    QuotaExceeded => "quota_exceeded", 429, ResourceExhausted,
        Some("etcdserver: mvcc: database space exceeded"), Never;
    ValueTooLarge => "value_too_large", 413, InvalidArgument, None, Never;
    RequestTooLarge => "request_too_large", 413, InvalidArgument,
        Some("etcdserver: request is too large"), Never;
    /// A message over what the transport takes (the request limit plus the
    /// gRPC allowance), refused unread with grpc-go's code, as etcd's
    /// transport refuses it.
    MessageTooLarge => "message_too_large", 413, ResourceExhausted, None, Never;
    /// A put with `ignore_value` or `ignore_lease` names a key that does
    /// not exist.
    KeyNotFound => "key_not_found", 404, InvalidArgument,
        Some("etcdserver: key not found"), Never;
    KeyNotProvided => "key_not_provided", 400, InvalidArgument,
        Some("etcdserver: key is not provided"), Never;
    /// A put with `ignore_value` also carries a value.
    ValueProvided => "value_provided", 400, InvalidArgument,
        Some("etcdserver: value is provided"), Never;
    /// A put with `ignore_lease` also carries a lease.
    LeaseProvided => "lease_provided", 400, InvalidArgument,
        Some("etcdserver: lease is provided"), Never;
    TooManyTxnOps => "too_many_txn_ops", 400, InvalidArgument,
        Some("etcdserver: too many operations in txn request"), Never;
    /// One txn branch writes a key twice.
    DuplicateKey => "duplicate_key", 400, InvalidArgument,
        Some("etcdserver: duplicate key given in txn request"), Never;
    /// A watch asked for an id its stream already uses. etcd reports it as
    /// a watch cancel reason, which its clients read as FailedPrecondition.
    WatchIdExists => "watch_id_exists", 409, FailedPrecondition,
        Some("mvcc: duplicate watch ID provided"), Never;
    InvalidArgument => "invalid_argument", 400, InvalidArgument, None, Never;
    /// A request for keys this cell does not own: the directory of cells
    /// (DESIGN section 9) routes them to another cell. Nothing was applied;
    /// a proxy reads the directory again and routes the request there.
    /// HTTP 421 Misdirected Request.
    WrongCell => "wrong_cell", 421, FailedPrecondition, None, Never;
    /// A request whose keys lie in more than one cell (a txn, a range or a
    /// watch over prefixes of two cells): refused whole, never half-applied.
    CrossCell => "cross_cell", 400, InvalidArgument, None, Never;
    /// A watcher fell behind its bounded buffer and was dropped so that it
    /// slows nobody else; it resumes from the revision the message names.
    WatchTooSlow => "watch_too_slow", 503, ResourceExhausted, None, Safe;
    /// A watch over a limit on watches (one stream's, or one proxy's):
    /// nothing was created.
    TooManyWatches => "too_many_watches", 429, ResourceExhausted, None, Never;

    // --- membership ---
    MemberNotFound => "member_not_found", 404, NotFound,
        Some("etcdserver: member not found"), Never;
    MemberExists => "member_exists", 409, FailedPrecondition,
        Some("etcdserver: member ID already exist"), Never;
    PeerUrlExists => "peer_url_exists", 409, FailedPrecondition,
        Some("etcdserver: Peer URLs already exists"), Never;
    MemberBadUrls => "member_bad_urls", 400, InvalidArgument,
        Some("etcdserver: given member URLs are invalid"), Never;
    MemberNotLearner => "member_not_learner", 409, FailedPrecondition,
        Some("etcdserver: can only promote a learner member"), Never;
    LearnerNotReady => "learner_not_ready", 409, FailedPrecondition,
        Some("etcdserver: can only promote a learner member which is in sync with leader"),
        Never;
    /// A membership change would leave the voters that are up short of a
    /// quorum of the new configuration (etcd's strict reconfig check).
    NotEnoughStartedMembers => "not_enough_started_members", 409, FailedPrecondition,
        Some("etcdserver: re-configuration failed due to not enough started members"), Never;
    /// The target of a leader transfer is not a voting member.
    BadLeaderTransferee => "bad_leader_transferee", 400, FailedPrecondition,
        Some("etcdserver: bad leader transferee"), Never;
    /// A leader transfer did not finish in time; it may still complete.
    /// etcd has no gRPC mapping for this error and sends it as Unknown.
    LeaderTransferTimeout => "leader_transfer_timeout", 504, Unknown,
        Some("etcdserver: request timed out, leader transfer took too long"), OutcomeUnknown;

    // --- identities and permissions ---
    /// An Auth API call that needs authentication on (Authenticate).
    AuthNotEnabled => "auth_not_enabled", 409, FailedPrecondition,
        Some("etcdserver: authentication is not enabled"), Never;
    /// A wrong user name and a wrong password answer alike.
    AuthFailed => "auth_failed", 401, InvalidArgument,
        Some("etcdserver: authentication failed, invalid user ID or password"), Never;
    /// The token is unsigned, forged, expired or names a user that is
    /// gone: authenticate again (etcd's clients do so on this text).
    InvalidAuthToken => "invalid_auth_token", 401, Unauthenticated,
        Some("etcdserver: invalid auth token"), Never;
    /// Authentication is on and the request carries no identity.
    UserEmpty => "user_empty", 401, InvalidArgument,
        Some("etcdserver: user name is empty"), Never;
    /// The caller is known and its roles do not allow the operation.
    PermissionDenied => "permission_denied", 403, PermissionDenied,
        Some("etcdserver: permission denied"), Never;
    /// Too many attempts (of Authenticate, by one user or one source):
    /// `Detail::RetryAfter` says when to try again. Nothing happened; not
    /// retried at once by a proxy, which would only add attempts.
    RateLimited => "rate_limited", 429, ResourceExhausted, None, Never;
    /// No tenant of that name (the tenants API).
    TenantNotFound => "tenant_not_found", 404, NotFound, None, Never;
    UserExists => "user_exists", 409, FailedPrecondition,
        Some("etcdserver: user name already exists"), Never;
    UserNotFound => "user_not_found", 404, FailedPrecondition,
        Some("etcdserver: user name not found"), Never;
    RoleExists => "role_exists", 409, FailedPrecondition,
        Some("etcdserver: role name already exists"), Never;
    RoleNotFound => "role_not_found", 404, FailedPrecondition,
        Some("etcdserver: role name not found"), Never;
    RoleEmpty => "role_empty", 400, InvalidArgument,
        Some("etcdserver: role name is empty"), Never;
    RoleNotGranted => "role_not_granted", 409, FailedPrecondition,
        Some("etcdserver: role is not granted to the user"), Never;
    PermissionNotGranted => "permission_not_granted", 409, FailedPrecondition,
        Some("etcdserver: permission is not granted to the role"), Never;
    /// Authentication cannot be turned on without a root user.
    RootUserNotExist => "root_user_not_exist", 409, FailedPrecondition,
        Some("etcdserver: root user does not exist"), Never;
    /// ... nor with a root user that lacks the root role (etcdctl then
    /// adds the role and grants it).
    RootRoleNotExist => "root_role_not_exist", 409, FailedPrecondition,
        Some("etcdserver: root user does not have root role"), Never;
    /// A change that would lock every admin out while authentication is
    /// on (deleting root, revoking its root role).
    InvalidAuthMgmt => "invalid_auth_mgmt", 400, InvalidArgument,
        Some("etcdserver: invalid auth management"), Never;

    // --- availability ---
    /// Not servable now, and nothing was sent or proposed.
    Unavailable => "unavailable", 503, Unavailable, None, Safe;
    /// The deadline passed before an answer: a write may have been
    /// committed.
    Timeout => "timeout", 504, Unavailable,
        Some("etcdserver: request timed out"), OutcomeUnknown;
    /// The connection to the member serving a request broke after the
    /// request may have been sent: it may or may not have been applied.
    WriteOutcomeUnknown => "write_outcome_unknown", 502, Unavailable,
        Some("etcdserver: request timed out, possibly due to connection lost"), OutcomeUnknown;
    Unimplemented => "unimplemented", 501, Unimplemented, None, Never;
    /// An HTTP path the API does not have.
    RouteNotFound => "route_not_found", 404, NotFound, None, Never;
    /// An HTTP method the path does not take.
    MethodNotAllowed => "method_not_allowed", 405, Unimplemented, None, Never;
    /// A failure nobody foresaw. It is not a verdict on the request, and
    /// nothing says the request did not take effect, so the outcome is
    /// unknown.
    Internal => "internal", 500, Internal, None, OutcomeUnknown;
}

impl ErrorCode {
    /// The stable `snake_case` name (the `error` field of the JSON body).
    pub const fn as_str(self) -> &'static str {
        self.wire().name
    }

    /// The code with this name, if any.
    pub fn from_name(name: &str) -> Option<ErrorCode> {
        ErrorCode::ALL.iter().copied().find(|c| c.as_str() == name)
    }

    /// The code whose etcd text is exactly `text`, if any.
    pub fn from_etcd_text(text: &str) -> Option<ErrorCode> {
        ErrorCode::ALL
            .iter()
            .copied()
            .find(|c| c.etcd_text() == Some(text))
    }

    pub const fn retry(self) -> Retry {
        self.wire().retry
    }

    pub const fn http_status(self) -> u16 {
        self.wire().http_status
    }

    pub const fn grpc_code(self) -> Code {
        self.wire().grpc_code
    }

    pub const fn etcd_text(self) -> Option<&'static str> {
        self.wire().etcd_text
    }

    /// True when the code means "this member is broken", so a proxy
    /// ejects the member rather than retrying elsewhere. Every other code
    /// is about the request or about where it should go.
    pub const fn is_member_fault(self) -> bool {
        matches!(self, ErrorCode::MemberStopped)
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Encoded by name, never by position: codes cross the peer wire inside
/// bincode payloads, where a derived enum would be its variant index.
impl Serialize for ErrorCode {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for ErrorCode {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Name;
        impl serde::de::Visitor<'_> for Name {
            type Value = ErrorCode;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a latchkey error code name")
            }

            fn visit_str<E: serde::de::Error>(self, name: &str) -> Result<ErrorCode, E> {
                ErrorCode::from_name(name)
                    .ok_or_else(|| E::custom(format!("unknown error code {name:?}")))
            }
        }
        deserializer.deserialize_str(Name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn names_are_unique_snake_case_and_round_trip() {
        let mut seen = HashSet::new();
        for &code in ErrorCode::ALL {
            let name = code.as_str();
            assert!(seen.insert(name), "{name} used twice");
            assert!(
                name.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'),
                "{name} is not snake_case"
            );
            assert_eq!(ErrorCode::from_name(name), Some(code));
        }
        assert_eq!(ErrorCode::from_name("no_such_code"), None);
    }

    #[test]
    fn every_etcd_text_is_in_exactly_one_row() {
        let mut seen = HashSet::new();
        for &code in ErrorCode::ALL {
            if let Some(text) = code.etcd_text() {
                assert!(seen.insert(text), "{text:?} is in two rows");
                assert_eq!(ErrorCode::from_etcd_text(text), Some(code));
            }
        }
    }

    #[test]
    fn etcd_texts_carry_etcds_grpc_codes() {
        // Spot checks against etcd's rpctypes, where a wrong code would
        // change what etcd clients retry.
        let cases = [
            (ErrorCode::NotLeader, Code::FailedPrecondition),
            (ErrorCode::NoLeader, Code::Unavailable),
            (ErrorCode::Timeout, Code::Unavailable),
            (ErrorCode::MemberStopped, Code::Unavailable),
            (ErrorCode::LeaseTtlTooLarge, Code::OutOfRange),
            (ErrorCode::Compacted, Code::OutOfRange),
            (ErrorCode::KeyNotFound, Code::InvalidArgument),
            (ErrorCode::BadLeaderTransferee, Code::FailedPrecondition),
            (ErrorCode::QuotaExceeded, Code::ResourceExhausted),
            (ErrorCode::InvalidAuthToken, Code::Unauthenticated),
            (ErrorCode::PermissionDenied, Code::PermissionDenied),
            (ErrorCode::UserEmpty, Code::InvalidArgument),
            (ErrorCode::AuthFailed, Code::InvalidArgument),
            (ErrorCode::RootRoleNotExist, Code::FailedPrecondition),
        ];
        for (code, grpc) in cases {
            assert_eq!(code.grpc_code(), grpc, "{code}");
        }
    }

    #[test]
    fn retry_classes() {
        use Retry::*;
        let cases = [
            (ErrorCode::NotLeader, Safe),
            (ErrorCode::NoLeader, Safe),
            (ErrorCode::Unavailable, Safe),
            (ErrorCode::Timeout, OutcomeUnknown),
            (ErrorCode::WriteOutcomeUnknown, OutcomeUnknown),
            (ErrorCode::MemberStopped, OutcomeUnknown),
            (ErrorCode::Internal, OutcomeUnknown),
            (ErrorCode::InvalidArgument, Never),
            (ErrorCode::KeyNotProvided, Never),
            (ErrorCode::Compacted, Never),
            (ErrorCode::LeaseNotFound, Never),
        ];
        for (code, retry) in cases {
            assert_eq!(code.retry(), retry, "{code}");
        }
    }

    #[test]
    fn only_a_stopped_member_is_a_member_fault() {
        let faults: Vec<_> = ErrorCode::ALL
            .iter()
            .filter(|c| c.is_member_fault())
            .collect();
        assert_eq!(faults, [&ErrorCode::MemberStopped]);
    }

    #[test]
    fn http_statuses_are_errors() {
        for &code in ErrorCode::ALL {
            assert!((400..600).contains(&code.http_status()), "{code}");
            assert_ne!(code.grpc_code(), Code::Ok, "{code}");
        }
    }
}
