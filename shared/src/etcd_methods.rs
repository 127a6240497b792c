//! Every etcd v3 gRPC method path latchkey calls or records, named once.
//!
//! A path is what a raw tonic call needs (`PathAndQuery`), and the proxy
//! labels its request metrics with it, so a face, an operation and a
//! client all take it from here instead of spelling it again. One module
//! per etcd service, as in `rpc.proto`.

/// gRPC metadata etcd's clients and gRPC proxy send with a stream that
/// must end while the member has no leader (`clientv3.WithRequireLeader`;
/// value `true`).
pub const REQUIRE_LEADER: &str = "hasleader";

/// `etcdserverpb.KV`.
pub mod kv {
    pub const RANGE: &str = "/etcdserverpb.KV/Range";
    /// A range answered in several messages (`RangeStream`, in the
    /// `rpc.proto` the etcd-client crate carries).
    pub const RANGE_STREAM: &str = "/etcdserverpb.KV/RangeStream";
    pub const PUT: &str = "/etcdserverpb.KV/Put";
    pub const DELETE_RANGE: &str = "/etcdserverpb.KV/DeleteRange";
    pub const TXN: &str = "/etcdserverpb.KV/Txn";
    pub const COMPACT: &str = "/etcdserverpb.KV/Compact";
}

/// `etcdserverpb.Lease`.
pub mod lease {
    pub const GRANT: &str = "/etcdserverpb.Lease/LeaseGrant";
    pub const REVOKE: &str = "/etcdserverpb.Lease/LeaseRevoke";
    pub const KEEP_ALIVE: &str = "/etcdserverpb.Lease/LeaseKeepAlive";
    pub const TIME_TO_LIVE: &str = "/etcdserverpb.Lease/LeaseTimeToLive";
    pub const LEASES: &str = "/etcdserverpb.Lease/LeaseLeases";
}

/// `etcdserverpb.Watch`.
pub mod watch {
    pub const WATCH: &str = "/etcdserverpb.Watch/Watch";
}

/// `etcdserverpb.Cluster`.
pub mod cluster {
    pub const MEMBER_ADD: &str = "/etcdserverpb.Cluster/MemberAdd";
    pub const MEMBER_REMOVE: &str = "/etcdserverpb.Cluster/MemberRemove";
    pub const MEMBER_UPDATE: &str = "/etcdserverpb.Cluster/MemberUpdate";
    pub const MEMBER_LIST: &str = "/etcdserverpb.Cluster/MemberList";
    pub const MEMBER_PROMOTE: &str = "/etcdserverpb.Cluster/MemberPromote";
}

/// `etcdserverpb.Maintenance`.
pub mod maintenance {
    pub const ALARM: &str = "/etcdserverpb.Maintenance/Alarm";
    pub const STATUS: &str = "/etcdserverpb.Maintenance/Status";
    pub const DEFRAGMENT: &str = "/etcdserverpb.Maintenance/Defragment";
    pub const HASH: &str = "/etcdserverpb.Maintenance/Hash";
    pub const HASH_KV: &str = "/etcdserverpb.Maintenance/HashKV";
    pub const SNAPSHOT: &str = "/etcdserverpb.Maintenance/Snapshot";
    pub const MOVE_LEADER: &str = "/etcdserverpb.Maintenance/MoveLeader";
    pub const DOWNGRADE: &str = "/etcdserverpb.Maintenance/Downgrade";
}

/// `etcdserverpb.Auth`.
pub mod auth {
    pub const AUTH_ENABLE: &str = "/etcdserverpb.Auth/AuthEnable";
    pub const AUTH_DISABLE: &str = "/etcdserverpb.Auth/AuthDisable";
    pub const AUTH_STATUS: &str = "/etcdserverpb.Auth/AuthStatus";
    pub const AUTHENTICATE: &str = "/etcdserverpb.Auth/Authenticate";
    pub const USER_ADD: &str = "/etcdserverpb.Auth/UserAdd";
    pub const USER_GET: &str = "/etcdserverpb.Auth/UserGet";
    pub const USER_LIST: &str = "/etcdserverpb.Auth/UserList";
    pub const USER_DELETE: &str = "/etcdserverpb.Auth/UserDelete";
    pub const USER_CHANGE_PASSWORD: &str = "/etcdserverpb.Auth/UserChangePassword";
    pub const USER_GRANT_ROLE: &str = "/etcdserverpb.Auth/UserGrantRole";
    pub const USER_REVOKE_ROLE: &str = "/etcdserverpb.Auth/UserRevokeRole";
    pub const ROLE_ADD: &str = "/etcdserverpb.Auth/RoleAdd";
    pub const ROLE_GET: &str = "/etcdserverpb.Auth/RoleGet";
    pub const ROLE_LIST: &str = "/etcdserverpb.Auth/RoleList";
    pub const ROLE_DELETE: &str = "/etcdserverpb.Auth/RoleDelete";
    pub const ROLE_GRANT_PERMISSION: &str = "/etcdserverpb.Auth/RoleGrantPermission";
    pub const ROLE_REVOKE_PERMISSION: &str = "/etcdserverpb.Auth/RoleRevokePermission";
}

/// `latchkey.proxyauth.v1.ProxyAuth` (latchkey's, proxies only).
pub mod proxy_auth {
    pub const CHECK_READS: &str = "/latchkey.proxyauth.v1.ProxyAuth/CheckReads";
}

/// `latchkey.moves.v1.Moves` (latchkey's, proxies only).
pub mod moves {
    pub const RAISE_REVISION: &str = "/latchkey.moves.v1.Moves/RaiseRevision";
    pub const IMPORT: &str = "/latchkey.moves.v1.Moves/Import";
}

/// `latchkey.tenants.v1.Tenants` (latchkey's, not etcd's).
pub mod tenants {
    pub const PUT: &str = "/latchkey.tenants.v1.Tenants/Put";
    pub const GET: &str = "/latchkey.tenants.v1.Tenants/Get";
    pub const LIST: &str = "/latchkey.tenants.v1.Tenants/List";
    pub const DELETE: &str = "/latchkey.tenants.v1.Tenants/Delete";
}

/// `v3lockpb.Lock` (etcd's lock service).
pub mod lock {
    pub const LOCK: &str = "/v3lockpb.Lock/Lock";
    pub const UNLOCK: &str = "/v3lockpb.Lock/Unlock";
}

/// `v3electionpb.Election` (etcd's election service).
pub mod election {
    pub const CAMPAIGN: &str = "/v3electionpb.Election/Campaign";
    pub const PROCLAIM: &str = "/v3electionpb.Election/Proclaim";
    pub const LEADER: &str = "/v3electionpb.Election/Leader";
    pub const OBSERVE: &str = "/v3electionpb.Election/Observe";
    pub const RESIGN: &str = "/v3electionpb.Election/Resign";
}

/// The methods answered in one message.
pub const UNARY: [&str; 27] = [
    kv::RANGE,
    kv::PUT,
    kv::DELETE_RANGE,
    kv::TXN,
    kv::COMPACT,
    lease::GRANT,
    lease::REVOKE,
    lease::TIME_TO_LIVE,
    lease::LEASES,
    cluster::MEMBER_ADD,
    cluster::MEMBER_REMOVE,
    cluster::MEMBER_UPDATE,
    cluster::MEMBER_LIST,
    cluster::MEMBER_PROMOTE,
    maintenance::ALARM,
    maintenance::STATUS,
    maintenance::DEFRAGMENT,
    maintenance::HASH,
    maintenance::HASH_KV,
    maintenance::MOVE_LEADER,
    maintenance::DOWNGRADE,
    lock::LOCK,
    lock::UNLOCK,
    election::CAMPAIGN,
    election::PROCLAIM,
    election::LEADER,
    election::RESIGN,
];

/// The methods whose answer (or request) is a stream.
pub const STREAMING: [&str; 5] = [
    kv::RANGE_STREAM,
    lease::KEEP_ALIVE,
    watch::WATCH,
    maintenance::SNAPSHOT,
    election::OBSERVE,
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_path_is_unary_or_streaming_once() {
        let mut all: Vec<&str> = UNARY.iter().chain(STREAMING.iter()).copied().collect();
        let n = all.len();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), n, "a path is listed twice");
        assert!(all
            .iter()
            .all(|p| p.starts_with('/') && p[1..].contains('/')));
    }
}
