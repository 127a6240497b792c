//! `/v1/kv/{key}`: read, write and delete keys. The key is the rest of the
//! path (slashes included, percent-decoded); the value is the raw body.

use super::extract::{on, Client, Flag, KeyedBody, Path, Query};
use super::model::{parse_session, session_gone, DeleteAnswer, ErrorBody, PutAnswer, RangeAnswer};
use super::{answer, Answer};
use crate::ops;
use crate::ops::idempotency::{self, Committed};
use crate::state::ProxyState;
use axum::extract::State;
use latchkey_shared::etcd_enums::{CompareResult, CompareTarget};
use latchkey_shared::etcdpb::{
    PbCompare, PbDeleteRequest, PbPutRequest, PbRangeRequest, PbTargetUnion, PbTxnOpRequest,
    PbTxnOpResponse, PbTxnRequest, PbTxnRequestOp, PbTxnResponse,
};
use latchkey_shared::{ApiError, KeyRange};
use serde::Deserialize;
use std::sync::Arc;
use utoipa::IntoParams;

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct GetParams {
    /// Every key that starts with the path's key.
    #[param(value_type = Option<bool>)]
    pub prefix: Option<Flag>,
    /// Answer from the member's own state, possibly stale (with the
    /// revision it reflects), instead of a linearizable read.
    #[param(value_type = Option<bool>)]
    pub serializable: Option<Flag>,
    /// Read as of this revision (0 or absent: the latest).
    pub revision: Option<i64>,
    /// At most this many keys (0 or absent: no limit).
    pub limit: Option<i64>,
    /// Keys and metadata only, no values.
    #[param(value_type = Option<bool>)]
    pub keys_only: Option<Flag>,
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct PutParams {
    /// Bind the key to this session (hex id): it is deleted when the
    /// session ends.
    pub session: Option<String>,
    /// Write only if the key's mod_revision is this (0: the key is absent).
    pub if_mod_revision: Option<i64>,
    /// Write only if the key's version is this (0: the key is absent).
    pub if_version: Option<i64>,
    /// Write only if the key does not exist.
    #[param(value_type = Option<bool>)]
    pub if_absent: Option<Flag>,
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct DeleteParams {
    /// Delete every key that starts with the path's key.
    #[param(value_type = Option<bool>)]
    pub prefix: Option<Flag>,
}

/// The etcd key and range_end of a key (from a path or a txn operation),
/// alone or as a prefix; an empty key is `key_not_provided`.
pub fn key_range(key: &[u8], prefix: bool) -> Result<KeyRange, ApiError> {
    if key.is_empty() {
        return Err(ApiError::key_not_provided());
    }
    Ok(if prefix {
        KeyRange::prefix(key)
    } else {
        KeyRange::single(key.to_vec())
    })
}

fn non_negative(name: &str, value: Option<i64>) -> Result<i64, ApiError> {
    match value {
        None => Ok(0),
        Some(v) if v >= 0 => Ok(v),
        Some(v) => Err(ApiError::invalid(format!(
            "{name} must be 0 or more, not {v}"
        ))),
    }
}

/// Read one key, or every key under a prefix.
#[utoipa::path(get, path = "/v1/kv/{*key}", tag = "kv",
    params(("key" = String, Path, description = "The key (the rest of the path)"), GetParams),
    responses((status = 200, body = RangeAnswer), (status = "4XX", body = ErrorBody), (status = "5XX", body = ErrorBody)))]
pub async fn get_kv(
    State(state): State<Arc<ProxyState>>,
    Path(key): Path<String>,
    Query(params): Query<GetParams>,
    Client(client): Client,
) -> Answer<RangeAnswer> {
    let range = key_range(key.as_bytes(), on(params.prefix))?;
    let keys_only = on(params.keys_only);
    let request = PbRangeRequest {
        key: range.start,
        range_end: range.end,
        revision: non_negative("revision", params.revision)?,
        limit: non_negative("limit", params.limit)?,
        keys_only,
        serializable: on(params.serializable),
        ..Default::default()
    };
    let resp = ops::kv::range(&state, client, request).await?;
    answer(RangeAnswer::from_pb(&resp, keys_only))
}

/// Write a key: the body is its value, stored as sent. Keys under
/// `\0latchkey/` (`%00latchkey/`) are latchkey's own records: clients may
/// read them, and a write or delete there is refused (`invalid_argument`).
#[utoipa::path(put, path = "/v1/kv/{*key}", tag = "kv",
    params(("key" = String, Path, description = "The key (the rest of the path)"), PutParams,
        ("Idempotency-Key" = Option<String>, Header, description = "Makes a retry safe: a retry with the same key and request gets the first answer and writes nothing; a different request under it is precondition_failed")),
    request_body(content = String, content_type = "application/octet-stream", description = "The value, raw"),
    responses((status = 200, body = PutAnswer), (status = 412, body = ErrorBody, description = "A precondition did not hold; nothing was written"),
        (status = "4XX", body = ErrorBody), (status = "5XX", body = ErrorBody)))]
pub async fn put_kv(
    State(state): State<Arc<ProxyState>>,
    Path(key): Path<String>,
    Query(params): Query<PutParams>,
    Client(client): Client,
    KeyedBody(value, keyed): KeyedBody,
) -> Answer<PutAnswer> {
    key_range(key.as_bytes(), false)?;
    let lease = match &params.session {
        Some(id) => parse_session(id)?.get(),
        None => 0,
    };
    let put = PbPutRequest {
        key: key.as_bytes().to_vec(),
        value: value.to_vec(),
        lease,
        ..Default::default()
    };
    let compares = preconditions(key.as_bytes(), &params)?;
    let ranges = [KeyRange::single(key.as_bytes().to_vec())];
    // Refused at once if the key is in no cell the directory names.
    state.upstream.route(&ranges)?;
    let guard = idempotency::guard(&state, keyed.as_ref()).await?;
    if compares.is_empty() && guard.is_none() {
        let resp = ops::kv::put(&state, client, put)
            .await
            .map_err(session_gone)?;
        return answer(PutAnswer {
            revision: resp.header.map_or(0, |h| h.revision),
        });
    }
    let txn = PbTxnRequest {
        compare: compares,
        success: vec![PbTxnRequestOp {
            request: Some(PbTxnOpRequest::RequestPut(put)),
        }],
        failure: vec![PbTxnRequestOp {
            request: Some(PbTxnOpRequest::RequestRange(PbRangeRequest {
                key: key.as_bytes().to_vec(),
                keys_only: true,
                ..Default::default()
            })),
        }],
    };
    // In the key's cell, held through a move's pause as every write is (a
    // cell refuses what it does not own before it applies anything).
    let committed = state
        .upstream
        .routed(&ranges, |cell| {
            let (state, txn, guard) = (&state, txn.clone(), guard.as_ref());
            async move { idempotency::txn(state, client, &cell, guard, txn).await }
        })
        .await;
    let resp = match committed.map_err(session_gone)? {
        Committed::Now(resp) => resp,
        Committed::Before(record, header) if record.succeeded => {
            return answer(PutAnswer {
                revision: header.revision,
            });
        }
        Committed::Before(_, header) => {
            return Err(ApiError::precondition_failed(format!(
                "key {key:?}: the put under this Idempotency-Key found its precondition \
                 false at revision {}; nothing was written",
                header.revision
            )))
        }
    };
    if !resp.succeeded {
        return Err(precondition_failed(&key, &resp));
    }
    answer(PutAnswer {
        revision: resp.header.map_or(0, |h| h.revision),
    })
}

/// The compares a put's preconditions ask for.
fn preconditions(key: &[u8], params: &PutParams) -> Result<Vec<PbCompare>, ApiError> {
    let mut compares = Vec::new();
    let mut compare = |target: CompareTarget, union: PbTargetUnion| {
        compares.push(PbCompare {
            result: CompareResult::Equal as i32,
            target: target as i32,
            key: key.to_vec(),
            range_end: Vec::new(),
            target_union: Some(union),
        })
    };
    if let Some(rev) = params.if_mod_revision {
        compare(
            CompareTarget::Mod,
            PbTargetUnion::ModRevision(non_negative("if_mod_revision", Some(rev))?),
        );
    }
    if let Some(version) = params.if_version {
        compare(
            CompareTarget::Version,
            PbTargetUnion::Version(non_negative("if_version", Some(version))?),
        );
    }
    if on(params.if_absent) {
        compare(CompareTarget::Create, PbTargetUnion::CreateRevision(0));
    }
    Ok(compares)
}

/// The error for a put whose precondition failed, naming what the key is.
fn precondition_failed(key: &str, resp: &PbTxnResponse) -> ApiError {
    let current = resp.responses.first().and_then(|r| match &r.response {
        Some(PbTxnOpResponse::ResponseRange(range)) => range.kvs.first().cloned(),
        _ => None,
    });
    match current {
        Some(kv) => ApiError::precondition_failed(format!(
            "key {key:?} is at mod_revision {} version {}; nothing was written",
            kv.mod_revision, kv.version
        )),
        None => ApiError::precondition_failed(format!(
            "key {key:?} does not exist; nothing was written"
        )),
    }
}

/// Delete a key, or every key under a prefix.
#[utoipa::path(delete, path = "/v1/kv/{*key}", tag = "kv",
    params(("key" = String, Path, description = "The key (the rest of the path)"), DeleteParams),
    responses((status = 200, body = DeleteAnswer), (status = "4XX", body = ErrorBody), (status = "5XX", body = ErrorBody)))]
pub async fn delete_kv(
    State(state): State<Arc<ProxyState>>,
    Path(key): Path<String>,
    Query(params): Query<DeleteParams>,
    Client(client): Client,
) -> Answer<DeleteAnswer> {
    let range = key_range(key.as_bytes(), on(params.prefix))?;
    let request = PbDeleteRequest {
        key: range.start,
        range_end: range.end,
        ..Default::default()
    };
    let resp = ops::kv::delete_range(&state, client, request).await?;
    answer(DeleteAnswer {
        revision: resp.header.map_or(0, |h| h.revision),
        deleted: resp.deleted,
    })
}
