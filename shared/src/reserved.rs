//! What clients may not write: latchkey's reserved keys
//! ([`RESERVED_PREFIX`], `\0latchkey/`: lock-delay, audit and idempotency
//! records). A client that wrote or deleted one could forge an audit
//! record, erase the record that makes a retry safe (so the retry runs
//! twice) or fake a lock delay. Clients may read them.
//!
//! The proxy checks every write a client sends through either face (a put,
//! a delete, every operation of a txn, nested ones too) before it goes
//! upstream; the lock and election recipes, on the proxy and on the cell,
//! refuse a name whose queue key would be reserved. latchkey's own writes there (the lock recipes' records, the
//! idempotency guard added around a client's txn) are built by the proxy
//! and never pass through these checks. A range that starts outside the
//! prefix never selects a reserved key ([`KeyRange::admits`]), so only a
//! delete that starts inside it is refused.
//!
//! A cell's own client port refuses them too ([`Caller::writes_records`]),
//! except to the proxies: while authentication is off, a request that
//! carries the proxies' key ([`proxy_key`]); once it is on, a holder of
//! the role `latchkey-proxy`.
//!
//! [`Caller::writes_records`]: crate::auth::Caller::writes_records
//! [`proxy_key`]: crate::auth::proxy_key
//!
//! [`KeyRange::admits`]: crate::key_range::KeyRange::admits

use crate::etcdpb::{PbDeleteRequest, PbPutRequest, PbTxnOpRequest, PbTxnRequest};
use crate::key_range::{is_reserved, RESERVED_PREFIX};
use crate::ApiError;

/// Refuses `key` if it is reserved; `what` names the write in the error.
fn check(what: &str, key: &[u8]) -> Result<(), ApiError> {
    if !is_reserved(key) {
        return Ok(());
    }
    Err(ApiError::invalid(format!(
        "{what} {:?}: keys under {:?} are latchkey's own records; clients may read them, \
         never write or delete them",
        key.escape_ascii().to_string(),
        RESERVED_PREFIX.escape_ascii().to_string(),
    )))
}

/// Refuses a client's put of a reserved key.
pub fn check_put(req: &PbPutRequest) -> Result<(), ApiError> {
    check("put", &req.key)
}

/// Refuses a client's delete of a range that starts inside the reserved
/// prefix (one that starts outside never selects a reserved key).
pub fn check_delete(req: &PbDeleteRequest) -> Result<(), ApiError> {
    check("delete", &req.key)
}

/// Refuses a lock or election whose queue key (its name, `/`, the lease)
/// would be reserved: the recipe writes it for the client, on the cell and
/// on the proxy alike.
pub fn check_recipe_key(key: &[u8]) -> Result<(), ApiError> {
    check("a lock or election at", key)
}

/// Refuses a client's txn with any such put or delete, in either branch,
/// at any depth.
pub fn check_txn(req: &PbTxnRequest) -> Result<(), ApiError> {
    for op in req.success.iter().chain(&req.failure) {
        match &op.request {
            Some(PbTxnOpRequest::RequestPut(p)) => check_put(p)?,
            Some(PbTxnOpRequest::RequestDeleteRange(d)) => check_delete(d)?,
            Some(PbTxnOpRequest::RequestTxn(t)) => check_txn(t)?,
            Some(PbTxnOpRequest::RequestRange(_)) | None => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::etcdpb::PbRangeRequest;
    use crate::txn_op::op;
    use crate::ErrorCode;

    fn put(key: &[u8]) -> PbPutRequest {
        PbPutRequest {
            key: key.to_vec(),
            value: b"v".to_vec(),
            ..Default::default()
        }
    }

    fn delete(key: &[u8], end: &[u8]) -> PbDeleteRequest {
        PbDeleteRequest {
            key: key.to_vec(),
            range_end: end.to_vec(),
            ..Default::default()
        }
    }

    #[test]
    fn puts_and_deletes_inside_the_reserved_prefix_are_refused_and_say_why() {
        let audit = b"\0latchkey/audit/forged";
        let e = check_put(&put(audit)).expect_err("a reserved put");
        assert_eq!(e.code, ErrorCode::InvalidArgument);
        assert!(
            e.message.contains("latchkey's own records"),
            "{}",
            e.message
        );
        assert!(
            e.message.contains("\\x00latchkey/audit/forged"),
            "{}",
            e.message
        );
        assert!(check_delete(&delete(audit, b"")).is_err());
        assert!(check_delete(&delete(RESERVED_PREFIX, &[0])).is_err());
        // Everything else, including ranges around the prefix (which never
        // select a reserved key) and a key that only looks like it.
        assert!(check_put(&put(b"latchkey/audit/x")).is_ok());
        assert!(check_put(&put(b"\0latchkey")).is_ok());
        assert!(check_delete(&delete(b"\0", b"\x01")).is_ok());
        assert!(check_delete(&delete(&[0], &[0])).is_ok());
    }

    #[test]
    fn a_txn_is_refused_for_a_reserved_write_in_either_branch_at_any_depth() {
        let forged = || op(PbTxnOpRequest::RequestPut(put(b"\0latchkey/idem/k")));
        let fine = || op(PbTxnOpRequest::RequestPut(put(b"jobs/1")));
        let read = || {
            op(PbTxnOpRequest::RequestRange(PbRangeRequest {
                key: b"\0latchkey/audit/".to_vec(),
                ..Default::default()
            }))
        };
        let txn = |success, failure| PbTxnRequest {
            success,
            failure,
            ..Default::default()
        };
        assert!(check_txn(&txn(vec![fine(), read()], vec![read()])).is_ok());
        assert!(check_txn(&txn(vec![fine(), forged()], vec![])).is_err());
        assert!(check_txn(&txn(vec![], vec![forged()])).is_err());
        let erase = op(PbTxnOpRequest::RequestDeleteRange(delete(
            b"\0latchkey/audit/",
            b"\0latchkey/audit0",
        )));
        assert!(check_txn(&txn(vec![erase], vec![])).is_err());
        let nested = op(PbTxnOpRequest::RequestTxn(txn(vec![], vec![forged()])));
        assert!(check_txn(&txn(vec![fine()], vec![nested])).is_err());
    }
}
