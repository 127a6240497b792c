//! Tenants on a member: their settings (the records under
//! `\0latchkey/tenants/`) and what they use (the keyspace's
//! [`TenantBook`](crate::mvcc::tenants::TenantBook)). Root only once
//! authentication is on.
//!
//! Every change goes through [`TenantOps::commit`], the one code path that
//! writes tenants' records: it reads them after a read index, checks the
//! change against every other tenant (no prefix has two owners), and
//! commits it as one txn that holds only if no other tenant change came
//! in between (else it reads again), with an audit record naming the
//! caller. The quotas themselves are enforced where writes are applied
//! ([`crate::mvcc::txn`]).

use super::kv::Kv;
use crate::mvcc::tenants::Usage;
use crate::node::CellNode;
use latchkey_shared::auth::records::encode;
use latchkey_shared::auth::token::now_unix_ms;
use latchkey_shared::auth::Caller;
use latchkey_shared::etcd_enums::{CompareResult, CompareTarget};
use latchkey_shared::etcdpb::{
    PbCompare, PbDeleteRequest, PbPutRequest, PbResponseHeader, PbTargetUnion, PbTxnOpRequest,
    PbTxnRequest,
};
use latchkey_shared::lock::audit;
use latchkey_shared::tenant::{self, TenantRecord, VERSION_KEY};
use latchkey_shared::txn_op::op;
use latchkey_shared::ApiError;
use serde::Serialize;
use std::sync::Arc;

/// How many times a change is decided again when another change committed
/// between its read and its txn.
const MAX_ATTEMPTS: usize = 8;

/// Where the audit records of tenant changes go.
const AUDIT_SUBPREFIX: &[u8] = b"tenant/";

/// A tenant change's audit record (JSON), beside the auth changes'.
#[derive(Debug, Serialize)]
struct TenantAudit<'a> {
    action: &'a str,
    tenant: &'a str,
    /// The settings written (none for a delete).
    settings: Option<&'a TenantRecord>,
    /// The authenticated caller; `anonymous` while authentication is off.
    actor: &'a str,
    at_unix_ms: u64,
}

pub struct TenantOps {
    node: Arc<CellNode>,
    kv: Kv,
}

impl TenantOps {
    pub fn new(node: Arc<CellNode>) -> TenantOps {
        TenantOps {
            kv: Kv::new(node.clone()),
            node,
        }
    }

    /// Every tenant's record as this member has applied them, and the
    /// version of the tenants' records (0 before the first change).
    fn records(&self) -> (i64, Vec<TenantRecord>) {
        self.node.state.read(|s| {
            let version = s.keys.get(VERSION_KEY).map_or(0, |kv| kv.mod_revision);
            let records = s.keys.tenants().iter().map(|o| (*o.record).clone());
            (version, records.collect())
        })
    }

    /// THE write path of tenants' records: `record` (or, with `None`, the
    /// deletion of tenant `name`) checked against the other tenants and
    /// committed with an audit record, only if no other change came first.
    async fn commit(
        &self,
        caller: &Caller,
        name: &str,
        record: Option<&TenantRecord>,
    ) -> Result<PbResponseHeader, ApiError> {
        let action = if record.is_some() {
            "tenant_put"
        } else {
            "tenant_delete"
        };
        for _ in 0..MAX_ATTEMPTS {
            self.node.linearizable_barrier().await?;
            let (version, others) = self.records();
            let write = match record {
                Some(r) => {
                    tenant::check(r, &others)?;
                    op(PbTxnOpRequest::RequestPut(PbPutRequest {
                        key: tenant::record_key(name),
                        value: r.encode(),
                        ..Default::default()
                    }))
                }
                None => {
                    if !others.iter().any(|o| o.name == name) {
                        return Err(ApiError::tenant_not_found(name));
                    }
                    op(PbTxnOpRequest::RequestDeleteRange(PbDeleteRequest {
                        key: tenant::record_key(name),
                        ..Default::default()
                    }))
                }
            };
            let actor = caller.name().unwrap_or("anonymous");
            let audit_record = TenantAudit {
                action,
                tenant: name,
                settings: record,
                actor,
                at_unix_ms: now_unix_ms(),
            };
            let audit_key = [
                audit::PREFIX,
                AUDIT_SUBPREFIX,
                format!("{version:020}-{action}-{name}").as_bytes(),
            ]
            .concat();
            let put = |key: Vec<u8>, value: Vec<u8>| {
                op(PbTxnOpRequest::RequestPut(PbPutRequest {
                    key,
                    value,
                    ..Default::default()
                }))
            };
            let txn = PbTxnRequest {
                compare: vec![PbCompare {
                    result: CompareResult::Equal as i32,
                    target: CompareTarget::Mod as i32,
                    key: VERSION_KEY.to_vec(),
                    range_end: Vec::new(),
                    target_union: Some(PbTargetUnion::ModRevision(version)),
                }],
                success: vec![
                    write,
                    put(VERSION_KEY.to_vec(), b"1".to_vec()),
                    put(audit_key, encode(&audit_record)),
                ],
                failure: Vec::new(),
            };
            let reply = self.kv.txn(txn, true).await?;
            if reply.succeeded {
                tracing::info!(action, tenant = name, actor, "tenant change");
                return Ok(reply.header.unwrap_or_else(|| self.node.header_now()));
            }
        }
        Err(ApiError::unavailable(
            "the tenants' records kept changing under this change; try again",
        ))
    }

    /// Adds tenant `record.name` or replaces its settings.
    pub async fn put(
        &self,
        caller: &Caller,
        record: TenantRecord,
    ) -> Result<PbResponseHeader, ApiError> {
        caller.require_admin("changing a tenant")?;
        tenant::check_name(&record.name)?;
        self.commit(caller, &record.name.clone(), Some(&record))
            .await
    }

    pub async fn delete(&self, caller: &Caller, name: &str) -> Result<PbResponseHeader, ApiError> {
        caller.require_admin("deleting a tenant")?;
        tenant::check_name(name)?;
        self.commit(caller, name, None).await
    }

    /// One tenant's settings and use, as this member has applied them.
    pub fn get(
        &self,
        caller: &Caller,
        name: &str,
    ) -> Result<(PbResponseHeader, TenantRecord, Usage), ApiError> {
        caller.require_admin("reading a tenant")?;
        let found = self.node.state.read(|s| {
            s.keys
                .tenants()
                .get(name)
                .map(|o| ((*o.record).clone(), o.usage))
        });
        let (record, usage) = found.ok_or_else(|| ApiError::tenant_not_found(name))?;
        Ok((self.node.header_now(), record, usage))
    }

    /// Every tenant's settings and use, by name.
    pub fn list(
        &self,
        caller: &Caller,
    ) -> Result<(PbResponseHeader, Vec<(TenantRecord, Usage)>), ApiError> {
        caller.require_admin("listing tenants")?;
        let all = self.node.state.read(|s| {
            s.keys
                .tenants()
                .iter()
                .map(|o| ((*o.record).clone(), o.usage))
                .collect()
        });
        Ok((self.node.header_now(), all))
    }
}
