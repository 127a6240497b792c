//! etcd's Auth API on a member: users, roles, permissions, the on/off
//! switch and `Authenticate`, in etcd's words and with etcd's errors.
//!
//! Every change goes through [`AuthOps::commit`], the one code path that
//! writes the auth records (under `\0latchkey/auth/`, which clients can
//! neither read nor write): it reads the view after a read index, builds
//! the change on it, and commits it as one txn that holds only if the auth
//! version is still the one it read (else it reads again), together with
//! an audit record naming the caller. So changes from any member apply in
//! one order, each on the state it was decided on.
//!
//! Who may call what (etcd's rules): `Authenticate` and `AuthStatus`
//! anyone; `UserGet` and `UserChangePassword` on oneself and `RoleGet` on
//! a role one holds; everything else needs the root role once
//! authentication is on.

use super::auth_gate::AuthGate;
use super::kv::Kv;
use crate::node::CellNode;
use latchkey_shared::auth::limiter::AttemptLimiter;
use latchkey_shared::auth::password::RecentlyVerified;
use latchkey_shared::auth::records::{
    encode, role_key, token_key_key, user_key, PermKind, PermRecord, RoleRecord, TokenKey,
    UserRecord, ENABLED_KEY, ROOT, VERSION_KEY,
};
use latchkey_shared::auth::token::{self, now_unix_ms, KEYS_KEPT, TOKEN_TTL};
use latchkey_shared::auth::{password, AuthView, Caller};
use latchkey_shared::etcd_enums::{CompareResult, CompareTarget};
use latchkey_shared::etcdpb::{
    PbCompare, PbDeleteRequest, PbPutRequest, PbResponseHeader, PbTargetUnion, PbTxnOpRequest,
    PbTxnRequest, PbTxnRequestOp,
};
use latchkey_shared::lock::audit;
use latchkey_shared::txn_op::op;
use latchkey_shared::ApiError;
use serde::Serialize;
use std::sync::Arc;

/// How many times a change is decided again when another change committed
/// between its read and its txn.
const MAX_ATTEMPTS: usize = 8;

/// Where the audit records of auth changes go.
const AUDIT_SUBPREFIX: &[u8] = b"auth/";

/// An auth change's audit record (JSON), beside force-release's.
#[derive(Debug, Serialize)]
struct AuthAudit<'a> {
    action: &'a str,
    /// The user or role changed.
    subject: &'a str,
    /// The authenticated caller; `anonymous` while authentication is off.
    actor: &'a str,
    at_unix_ms: u64,
}

/// What one change writes.
#[derive(Default)]
struct Change {
    puts: Vec<(Vec<u8>, Vec<u8>)>,
    deletes: Vec<Vec<u8>>,
}

impl Change {
    fn put_user(mut self, user: &UserRecord) -> Self {
        self.puts.push((user_key(&user.name), encode(user)));
        self
    }

    fn put_role(mut self, role: &RoleRecord) -> Self {
        self.puts.push((role_key(&role.name), encode(role)));
        self
    }
}

/// A user's password as etcd's requests carry it; a client-made hash
/// (etcd 3.5's `hashedPassword`) is refused, since latchkey stores only
/// argon2id hashes it made.
pub struct NewPassword<'a> {
    pub password: &'a str,
    pub hashed_password: &'a str,
    pub no_password: bool,
}

pub struct AuthOps {
    node: Arc<CellNode>,
    gate: Arc<AuthGate>,
    kv: Kv,
    by_user: AttemptLimiter,
    by_source: AttemptLimiter,
    recent: Option<RecentlyVerified>,
}

/// How long a right password spares the argon2 check of the next attempt
/// with it.
const RECENTLY_VERIFIED: std::time::Duration = std::time::Duration::from_secs(60);

/// Failed Authenticate attempts one user name may make: 10 at once, then
/// 2 a second (a person mistyping is never held up; a guesser gets 7 200
/// an hour at most, from everywhere together). Successes do not count.
const USER_FAILURES: (f64, u32) = (2.0, 10);
/// Failed Authenticate attempts from one source address. Successes do
/// not count: etcd's Go client authenticates again for every stream it
/// opens (etcd issue 11954), so a busy client authenticates many times a
/// second. A proxy's clients share its address here; each proxy limits its
/// own clients' addresses.
const SOURCE_FAILURES: (f64, u32) = (50.0, 100);

impl AuthOps {
    pub fn new(node: Arc<CellNode>, gate: Arc<AuthGate>) -> AuthOps {
        AuthOps {
            kv: Kv::new(node.clone()),
            node,
            gate,
            by_user: AttemptLimiter::new(
                "failed Authenticate attempts for one user",
                USER_FAILURES.0,
                USER_FAILURES.1,
            ),
            by_source: AttemptLimiter::new(
                "failed Authenticate attempts from one address",
                SOURCE_FAILURES.0,
                SOURCE_FAILURES.1,
            ),
            // Without randomness for its key there is no cache: every
            // attempt pays argon2.
            recent: RecentlyVerified::new(RECENTLY_VERIFIED).ok(),
        }
    }

    pub fn gate(&self) -> &AuthGate {
        &self.gate
    }

    /// THE write path of the auth records: `make` decides the change on
    /// the current view; it is committed with an audit record only if no
    /// other change came first.
    async fn commit(
        &self,
        caller: &Caller,
        action: &str,
        subject: &str,
        make: impl Fn(&AuthView) -> Result<Change, ApiError>,
    ) -> Result<PbResponseHeader, ApiError> {
        for _ in 0..MAX_ATTEMPTS {
            self.node.linearizable_barrier().await?;
            let view = self.gate.view();
            let change = make(&view)?;
            let audit_record = AuthAudit {
                action,
                subject,
                actor: caller.name().unwrap_or("anonymous"),
                at_unix_ms: now_unix_ms(),
            };
            let audit_key = [
                audit::PREFIX,
                AUDIT_SUBPREFIX,
                format!("{:020}-{action}", view.version).as_bytes(),
            ]
            .concat();
            let mut success: Vec<PbTxnRequestOp> = change
                .puts
                .into_iter()
                .chain([
                    (VERSION_KEY.to_vec(), b"1".to_vec()),
                    (audit_key, encode(&audit_record)),
                ])
                .map(|(key, value)| {
                    op(PbTxnOpRequest::RequestPut(PbPutRequest {
                        key,
                        value,
                        ..Default::default()
                    }))
                })
                .collect();
            success.extend(change.deletes.into_iter().map(|key| {
                op(PbTxnOpRequest::RequestDeleteRange(PbDeleteRequest {
                    key,
                    ..Default::default()
                }))
            }));
            let txn = PbTxnRequest {
                compare: vec![PbCompare {
                    result: CompareResult::Equal as i32,
                    target: CompareTarget::Mod as i32,
                    key: VERSION_KEY.to_vec(),
                    range_end: Vec::new(),
                    target_union: Some(PbTargetUnion::ModRevision(view.version)),
                }],
                success,
                failure: Vec::new(),
            };
            let reply = self.kv.txn(txn, true).await?;
            if reply.succeeded {
                tracing::info!(
                    action,
                    subject,
                    actor = caller.name().unwrap_or("anonymous"),
                    "auth change"
                );
                return Ok(reply.header.unwrap_or_else(|| self.node.header_now()));
            }
        }
        Err(ApiError::unavailable(
            "the auth records kept changing under this change; try again",
        ))
    }

    pub async fn enable(&self, caller: &Caller) -> Result<PbResponseHeader, ApiError> {
        caller.require_admin("turning authentication on")?;
        // A fresh signing key per enable (the rotation); chosen here, so
        // that every member applies the same one.
        let secret = token::new_secret()?;
        self.commit(caller, "auth_enable", "", |view| {
            let root = view
                .users
                .get(ROOT)
                .ok_or_else(ApiError::root_user_not_exist)?;
            if !root.roles.contains(ROOT) {
                return Err(ApiError::root_role_not_exist());
            }
            let mut change = Change::default();
            if view.enabled {
                return Ok(change);
            }
            let id = view.token_keys.last().map_or(1, |k| k.id + 1);
            let key = TokenKey {
                id,
                secret: secret.clone(),
            };
            change.puts.push((token_key_key(id), encode(&key)));
            let kept = KEYS_KEPT.saturating_sub(1);
            let old = view.token_keys.len().saturating_sub(kept);
            change
                .deletes
                .extend(view.token_keys[..old].iter().map(|k| token_key_key(k.id)));
            change.puts.push((ENABLED_KEY.to_vec(), b"1".to_vec()));
            Ok(change)
        })
        .await
    }

    pub async fn disable(&self, caller: &Caller) -> Result<PbResponseHeader, ApiError> {
        caller.require_admin("turning authentication off")?;
        self.commit(caller, "auth_disable", "", |_| {
            Ok(Change {
                deletes: vec![ENABLED_KEY.to_vec()],
                ..Change::default()
            })
        })
        .await
    }

    /// Whether authentication is on, and the auth version.
    pub fn status(&self) -> (PbResponseHeader, bool, u64) {
        let view = self.gate.view();
        (
            self.node.header_now(),
            view.enabled,
            view.version.max(0) as u64,
        )
    }

    /// A token for `name` if `password` is its password. An unknown user
    /// and a wrong password answer alike, after the same work. Attempts
    /// are limited per user name and per `source` address, before any
    /// work; only failures count.
    pub async fn authenticate(
        &self,
        name: &str,
        given: &str,
        source: Option<std::net::IpAddr>,
    ) -> Result<(PbResponseHeader, String), ApiError> {
        let now = tokio::time::Instant::now();
        if let Some(ip) = source {
            self.by_source.take(&ip.to_string(), now)?;
        }
        self.by_user.take(name, now)?;
        self.node.linearizable_barrier().await?;
        let view = self.gate.view();
        if !view.enabled {
            return Err(ApiError::auth_not_enabled());
        }
        let user = view.users.get(name).cloned();
        let stored = user.as_ref().and_then(|u| u.password_hash.clone());
        let recently = match (&self.recent, &stored) {
            (Some(recent), Some(hash)) => recent.holds(name, given, hash, now),
            _ => false,
        };
        let matches = if recently {
            true
        } else {
            let (given_owned, stored_owned) = (given.to_string(), stored.clone());
            let matches = tokio::task::spawn_blocking(move || {
                password::verify(&given_owned, stored_owned.as_deref())
            })
            .await
            .map_err(|e| ApiError::internal(format!("password check: {e}")))?;
            if let (true, Some(recent), Some(hash)) = (matches, &self.recent, &stored) {
                recent.remember(name, given, hash, now);
            }
            matches
        };
        let (Some(user), true) = (user, matches) else {
            return Err(ApiError::auth_failed());
        };
        self.by_user.refund(name);
        if let Some(ip) = source {
            self.by_source.refund(&ip.to_string());
        }
        let key = view
            .token_keys
            .last()
            .ok_or_else(|| ApiError::internal("authentication is on without a token key"))?;
        let token = token::sign(key, &user, now_unix_ms(), TOKEN_TTL);
        Ok((self.node.header_now(), token))
    }

    pub async fn user_add(
        &self,
        caller: &Caller,
        name: &str,
        new: NewPassword<'_>,
    ) -> Result<PbResponseHeader, ApiError> {
        caller.require_admin("adding a user")?;
        if name.is_empty() {
            return Err(ApiError::user_empty());
        }
        let password_hash = hash_new(new).await?;
        self.commit(caller, "user_add", name, |view| {
            if view.users.contains_key(name) {
                return Err(ApiError::user_exists(name));
            }
            Ok(Change::default().put_user(&UserRecord {
                name: name.to_string(),
                password_hash: password_hash.clone(),
                roles: Default::default(),
            }))
        })
        .await
    }

    /// The user's roles, sorted.
    pub fn user_get(
        &self,
        caller: &Caller,
        name: &str,
    ) -> Result<(PbResponseHeader, Vec<String>), ApiError> {
        if caller.name() != Some(name) {
            caller.require_admin("reading another user")?;
        }
        let view = self.gate.view();
        let user = view
            .users
            .get(name)
            .ok_or_else(|| ApiError::user_not_found(name))?;
        Ok((self.node.header_now(), user.roles.iter().cloned().collect()))
    }

    pub fn user_list(&self, caller: &Caller) -> Result<(PbResponseHeader, Vec<String>), ApiError> {
        caller.require_admin("listing users")?;
        let view = self.gate.view();
        Ok((self.node.header_now(), view.users.keys().cloned().collect()))
    }

    pub async fn user_delete(
        &self,
        caller: &Caller,
        name: &str,
    ) -> Result<PbResponseHeader, ApiError> {
        caller.require_admin("deleting a user")?;
        self.commit(caller, "user_delete", name, |view| {
            if !view.users.contains_key(name) {
                return Err(ApiError::user_not_found(name));
            }
            if view.enabled && name == ROOT {
                return Err(ApiError::invalid_auth_mgmt(
                    "the root user cannot be deleted while authentication is on",
                ));
            }
            Ok(Change {
                deletes: vec![user_key(name)],
                ..Change::default()
            })
        })
        .await
    }

    pub async fn user_change_password(
        &self,
        caller: &Caller,
        name: &str,
        new: NewPassword<'_>,
    ) -> Result<PbResponseHeader, ApiError> {
        if caller.name() != Some(name) {
            caller.require_admin("changing another user's password")?;
        }
        let password_hash = hash_new(new).await?;
        self.commit(caller, "user_change_password", name, |view| {
            let mut user = view
                .users
                .get(name)
                .cloned()
                .ok_or_else(|| ApiError::user_not_found(name))?;
            user.password_hash = password_hash.clone();
            Ok(Change::default().put_user(&user))
        })
        .await
    }

    pub async fn user_grant_role(
        &self,
        caller: &Caller,
        name: &str,
        role: &str,
    ) -> Result<PbResponseHeader, ApiError> {
        caller.require_admin("granting a role")?;
        self.commit(caller, "user_grant_role", name, |view| {
            let mut user = view
                .users
                .get(name)
                .cloned()
                .ok_or_else(|| ApiError::user_not_found(name))?;
            if !view.roles.contains_key(role) {
                return Err(ApiError::role_not_found(role));
            }
            user.roles.insert(role.to_string());
            Ok(Change::default().put_user(&user))
        })
        .await
    }

    pub async fn user_revoke_role(
        &self,
        caller: &Caller,
        name: &str,
        role: &str,
    ) -> Result<PbResponseHeader, ApiError> {
        caller.require_admin("revoking a role")?;
        self.commit(caller, "user_revoke_role", name, |view| {
            let mut user = view
                .users
                .get(name)
                .cloned()
                .ok_or_else(|| ApiError::user_not_found(name))?;
            if view.enabled && name == ROOT && role == ROOT {
                return Err(ApiError::invalid_auth_mgmt(
                    "the root user keeps the root role while authentication is on",
                ));
            }
            if !user.roles.remove(role) {
                return Err(ApiError::role_not_granted(name, role));
            }
            Ok(Change::default().put_user(&user))
        })
        .await
    }

    pub async fn role_add(
        &self,
        caller: &Caller,
        name: &str,
    ) -> Result<PbResponseHeader, ApiError> {
        caller.require_admin("adding a role")?;
        if name.is_empty() {
            return Err(ApiError::role_empty());
        }
        self.commit(caller, "role_add", name, |view| {
            if view.roles.contains_key(name) {
                return Err(ApiError::role_exists(name));
            }
            Ok(Change::default().put_role(&RoleRecord {
                name: name.to_string(),
                perms: Vec::new(),
            }))
        })
        .await
    }

    /// The role's permissions, sorted by key.
    pub fn role_get(
        &self,
        caller: &Caller,
        name: &str,
    ) -> Result<(PbResponseHeader, Vec<PermRecord>), ApiError> {
        let view = self.gate.view();
        let holds = caller
            .name()
            .and_then(|user| view.users.get(user))
            .is_some_and(|u| u.roles.contains(name));
        if !holds {
            caller.require_admin("reading a role one does not hold")?;
        }
        let role = view
            .roles
            .get(name)
            .ok_or_else(|| ApiError::role_not_found(name))?;
        Ok((self.node.header_now(), role.perms.clone()))
    }

    pub fn role_list(&self, caller: &Caller) -> Result<(PbResponseHeader, Vec<String>), ApiError> {
        caller.require_admin("listing roles")?;
        let view = self.gate.view();
        Ok((self.node.header_now(), view.roles.keys().cloned().collect()))
    }

    /// Deletes the role and takes it from every user who holds it.
    pub async fn role_delete(
        &self,
        caller: &Caller,
        name: &str,
    ) -> Result<PbResponseHeader, ApiError> {
        caller.require_admin("deleting a role")?;
        self.commit(caller, "role_delete", name, |view| {
            if !view.roles.contains_key(name) {
                return Err(ApiError::role_not_found(name));
            }
            if view.enabled && name == ROOT {
                return Err(ApiError::invalid_auth_mgmt(
                    "the root role cannot be deleted while authentication is on",
                ));
            }
            let mut change = Change {
                deletes: vec![role_key(name)],
                ..Change::default()
            };
            for user in view.users.values().filter(|u| u.roles.contains(name)) {
                let mut user = user.clone();
                user.roles.remove(name);
                change = change.put_user(&user);
            }
            Ok(change)
        })
        .await
    }

    /// Grants `perm` to the role; a permission on the same key and end is
    /// replaced (its kind changes), as in etcd.
    pub async fn role_grant_permission(
        &self,
        caller: &Caller,
        name: &str,
        perm: PermRecord,
    ) -> Result<PbResponseHeader, ApiError> {
        caller.require_admin("granting a permission")?;
        self.commit(caller, "role_grant_permission", name, |view| {
            let mut role = view
                .roles
                .get(name)
                .cloned()
                .ok_or_else(|| ApiError::role_not_found(name))?;
            role.perms
                .retain(|p| (&p.key, &p.range_end) != (&perm.key, &perm.range_end));
            role.perms.push(perm.clone());
            role.perms
                .sort_by(|a, b| (&a.key, &a.range_end).cmp(&(&b.key, &b.range_end)));
            Ok(Change::default().put_role(&role))
        })
        .await
    }

    pub async fn role_revoke_permission(
        &self,
        caller: &Caller,
        name: &str,
        key: &[u8],
        range_end: &[u8],
    ) -> Result<PbResponseHeader, ApiError> {
        caller.require_admin("revoking a permission")?;
        self.commit(caller, "role_revoke_permission", name, |view| {
            let mut role = view
                .roles
                .get(name)
                .cloned()
                .ok_or_else(|| ApiError::role_not_found(name))?;
            let before = role.perms.len();
            role.perms
                .retain(|p| (p.key.as_slice(), p.range_end.as_slice()) != (key, range_end));
            if role.perms.len() == before {
                return Err(ApiError::permission_not_granted(name));
            }
            Ok(Change::default().put_role(&role))
        })
        .await
    }
}

/// A permission from etcd's request fields.
pub fn perm_record(kind: i32, key: Vec<u8>, range_end: Vec<u8>) -> Result<PermRecord, ApiError> {
    let kind = PermKind::from_etcd(kind).ok_or_else(|| {
        ApiError::invalid(format!(
            "permission type {kind} is not READ, WRITE or READWRITE"
        ))
    })?;
    Ok(PermRecord {
        kind,
        key,
        range_end,
    })
}

/// The stored hash of a new password (hashed on a blocking thread), or
/// `None` for a user without one.
async fn hash_new(new: NewPassword<'_>) -> Result<Option<String>, ApiError> {
    if !new.hashed_password.is_empty() {
        return Err(ApiError::invalid(
            "a client-made password hash is not accepted: send the password (over TLS)",
        ));
    }
    if new.no_password {
        return Ok(None);
    }
    if new.password.is_empty() {
        return Err(ApiError::invalid(
            "the password is empty (a user without one is added with no_password)",
        ));
    }
    let given = new.password.to_string();
    let hash = tokio::task::spawn_blocking(move || password::hash(&given))
        .await
        .map_err(|e| ApiError::internal(format!("password hash: {e}")))??;
    Ok(Some(hash))
}
