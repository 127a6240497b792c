//! Errors as tests compare them.

/// An etcd-client error as `"Code: message"` (`"OutOfRange: etcdserver:
/// mvcc: required revision has been compacted"`), so one `assert_eq!`
/// checks both the gRPC code and etcd's exact text, and a failure shows
/// which of the two changed.
pub fn err_text(e: etcd_client::Error) -> String {
    match e {
        etcd_client::Error::GRpcStatus(s) => format!("{:?}: {}", s.code(), s.message()),
        other => other.to_string(),
    }
}
