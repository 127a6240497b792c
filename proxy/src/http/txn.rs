//! `POST /v1/txn`: compares, then the `success` operations if every
//! compare holds, the `failure` ones otherwise, in one revision.

use super::extract::{Client, KeyedJson};
use super::model::{
    decode, parse_session, session_gone, DeleteAnswer, Encoding, ErrorBody, PutAnswer, RangeAnswer,
};
use super::{answer, Answer};
use crate::http::kv::key_range;
use crate::ops::idempotency::{self, Committed};
use crate::state::ProxyState;
use axum::extract::State;
use latchkey_shared::etcd_enums::{CompareResult, CompareTarget};
use latchkey_shared::etcdpb::{
    PbCompare, PbDeleteRequest, PbPutRequest, PbRangeRequest, PbTargetUnion, PbTxnOpRequest,
    PbTxnOpResponse, PbTxnRequest, PbTxnRequestOp, PbTxnResponse,
};
use latchkey_shared::ApiError;
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use utoipa::ToSchema;

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TxnRequest {
    /// Every compare must hold for `success` to run.
    #[serde(default)]
    pub compare: Vec<Compare>,
    #[serde(default)]
    pub success: Vec<Op>,
    #[serde(default)]
    pub failure: Vec<Op>,
}

#[derive(Debug, Clone, Copy, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Target {
    Value,
    Version,
    CreateRevision,
    ModRevision,
    Session,
}

#[derive(Debug, Clone, Copy, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Relation {
    Equal,
    NotEqual,
    Greater,
    Less,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Compare {
    pub key: String,
    #[serde(default)]
    pub key_encoding: Encoding,
    /// Compare every key under `key` as a prefix.
    #[serde(default)]
    pub prefix: bool,
    pub target: Target,
    pub result: Relation,
    /// A string for `value` (with `value_encoding`), an integer for
    /// `version`, `create_revision` and `mod_revision`, a hex session id
    /// (or "" for none) for `session`.
    #[schema(value_type = Object)]
    pub value: serde_json::Value,
    #[serde(default)]
    pub value_encoding: Encoding,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Op {
    Put(PutOp),
    Delete(RangeOp),
    Get(RangeOp),
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PutOp {
    pub key: String,
    #[serde(default)]
    pub key_encoding: Encoding,
    pub value: String,
    #[serde(default)]
    pub value_encoding: Encoding,
    /// Bind the key to this session (hex id).
    pub session: Option<String>,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RangeOp {
    pub key: String,
    #[serde(default)]
    pub key_encoding: Encoding,
    #[serde(default)]
    pub prefix: bool,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum OpAnswer {
    Put(PutAnswer),
    Delete(DeleteAnswer),
    Get(RangeAnswer),
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct TxnAnswer {
    /// Whether every compare held (and `success` ran).
    pub succeeded: bool,
    /// The revision after the txn.
    pub revision: i64,
    /// One answer per operation of the branch that ran.
    pub responses: Vec<OpAnswer>,
}

/// A txn key decoded by its encoding, alone or as a prefix, as etcd's
/// `key` and `range_end`.
fn range_of(key: &str, encoding: Encoding, prefix: bool) -> Result<(Vec<u8>, Vec<u8>), ApiError> {
    let range = key_range(&decode(key, encoding, "key")?, prefix)?;
    Ok((range.start, range.end))
}

fn integer(value: &serde_json::Value, what: &str) -> Result<i64, ApiError> {
    value.as_i64().ok_or_else(|| {
        ApiError::invalid(format!(
            "a {what} compare needs an integer value, not {value}"
        ))
    })
}

fn compare_pb(c: Compare) -> Result<PbCompare, ApiError> {
    let (key, range_end) = range_of(&c.key, c.key_encoding, c.prefix)?;
    let (target, union) = match c.target {
        Target::Value => {
            let text = c.value.as_str().ok_or_else(|| {
                ApiError::invalid(format!(
                    "a value compare needs a string value, not {}",
                    c.value
                ))
            })?;
            (
                CompareTarget::Value,
                PbTargetUnion::Value(decode(text, c.value_encoding, "compare value")?),
            )
        }
        Target::Version => (
            CompareTarget::Version,
            PbTargetUnion::Version(integer(&c.value, "version")?),
        ),
        Target::CreateRevision => (
            CompareTarget::Create,
            PbTargetUnion::CreateRevision(integer(&c.value, "create_revision")?),
        ),
        Target::ModRevision => (
            CompareTarget::Mod,
            PbTargetUnion::ModRevision(integer(&c.value, "mod_revision")?),
        ),
        Target::Session => {
            let id = match c.value.as_str() {
                Some("") => 0,
                Some(hex) => parse_session(hex)?.get(),
                None => {
                    return Err(ApiError::invalid(
                        "a session compare needs a hex session id",
                    ))
                }
            };
            (CompareTarget::Lease, PbTargetUnion::Lease(id))
        }
    };
    let result = match c.result {
        Relation::Equal => CompareResult::Equal,
        Relation::NotEqual => CompareResult::NotEqual,
        Relation::Greater => CompareResult::Greater,
        Relation::Less => CompareResult::Less,
    };
    Ok(PbCompare {
        result: result as i32,
        target: target as i32,
        key,
        range_end,
        target_union: Some(union),
    })
}

fn op_pb(op: Op) -> Result<PbTxnRequestOp, ApiError> {
    let request = match op {
        Op::Put(p) => PbTxnOpRequest::RequestPut(PbPutRequest {
            key: range_of(&p.key, p.key_encoding, false)?.0,
            value: decode(&p.value, p.value_encoding, "value")?,
            lease: match &p.session {
                Some(id) => parse_session(id)?.get(),
                None => 0,
            },
            ..Default::default()
        }),
        Op::Delete(d) => {
            let (key, range_end) = range_of(&d.key, d.key_encoding, d.prefix)?;
            PbTxnOpRequest::RequestDeleteRange(PbDeleteRequest {
                key,
                range_end,
                ..Default::default()
            })
        }
        Op::Get(g) => {
            let (key, range_end) = range_of(&g.key, g.key_encoding, g.prefix)?;
            PbTxnOpRequest::RequestRange(PbRangeRequest {
                key,
                range_end,
                ..Default::default()
            })
        }
    };
    Ok(PbTxnRequestOp {
        request: Some(request),
    })
}

fn answer_of(resp: PbTxnResponse) -> TxnAnswer {
    let revision = resp.header.as_ref().map_or(0, |h| h.revision);
    let responses = resp
        .responses
        .into_iter()
        .filter_map(|r| r.response)
        .map(|r| match r {
            PbTxnOpResponse::ResponsePut(_) => OpAnswer::Put(PutAnswer { revision }),
            PbTxnOpResponse::ResponseDeleteRange(d) => OpAnswer::Delete(DeleteAnswer {
                revision,
                deleted: d.deleted,
            }),
            PbTxnOpResponse::ResponseRange(range) => {
                OpAnswer::Get(RangeAnswer::from_pb(&range, false))
            }
            // A nested txn cannot be asked for over HTTP.
            PbTxnOpResponse::ResponseTxn(_) => OpAnswer::Put(PutAnswer { revision }),
        })
        .collect();
    TxnAnswer {
        succeeded: resp.succeeded,
        revision,
        responses,
    }
}

/// Run a transaction.
#[utoipa::path(post, path = "/v1/txn", tag = "kv",
    params(("Idempotency-Key" = Option<String>, Header, description = "Makes a retry safe: a retry with the same key and request gets the first answer and does nothing; a different request under it is precondition_failed")),
    request_body = TxnRequest,
    responses((status = 200, body = TxnAnswer), (status = "4XX", body = ErrorBody), (status = "5XX", body = ErrorBody)))]
pub async fn txn(
    State(state): State<Arc<ProxyState>>,
    Client(client): Client,
    KeyedJson(req, keyed): KeyedJson<TxnRequest>,
) -> Answer<TxnAnswer> {
    let ops = req.compare.len() + req.success.len() + req.failure.len();
    if ops == 0 {
        return Err(ApiError::invalid(
            "a txn needs at least one compare or operation",
        ));
    }
    let request = PbTxnRequest {
        compare: req
            .compare
            .into_iter()
            .map(compare_pb)
            .collect::<Result<_, _>>()?,
        success: req
            .success
            .into_iter()
            .map(op_pb)
            .collect::<Result<_, _>>()?,
        failure: req
            .failure
            .into_iter()
            .map(op_pb)
            .collect::<Result<_, _>>()?,
    };
    let ranges = crate::ops::rates::txn_ranges(&request);
    // Refused at once if its keys span cells.
    state.upstream.route(&ranges)?;
    let guard = idempotency::guard(&state, keyed.as_ref()).await?;
    // In its keys' cell, held through a move's pause as every write is (a
    // cell refuses what it does not own before it applies anything).
    let (cell, committed) = state
        .upstream
        .routed(&ranges, |cell| {
            let (state, request, guard) = (&state, request.clone(), guard.as_ref());
            async move {
                let committed = idempotency::txn(state, client, &cell, guard, request).await?;
                Ok((cell, committed))
            }
        })
        .await
        .map_err(session_gone)?;
    match committed {
        Committed::Now(resp) => {
            let done = answer_of(resp);
            if let Some(guard) = &guard {
                let stored = serde_json::to_value(&done)
                    .map_err(|e| ApiError::internal(format!("a txn answer did not encode: {e}")))?;
                idempotency::remember(&cell, guard, done.revision, done.succeeded, stored).await;
            }
            answer(done)
        }
        Committed::Before(record, header) => match record.answer {
            Some(stored) => answer(serde_json::from_value(stored).map_err(|e| {
                ApiError::internal(format!("a kept txn answer did not decode: {e}"))
            })?),
            // The proxy that ran it stopped before it kept the answer.
            None => Err(ApiError::precondition_failed(format!(
                "the txn under this Idempotency-Key committed at revision {} \
                 (succeeded: {}), but its answer was not kept; nothing was done now",
                header.revision, record.succeeded
            ))),
        },
    }
}
