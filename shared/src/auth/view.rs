//! [`AuthView`]: the auth records at one version, decoded once and shared
//! by every request until the next change; [`Caller`]: who sent a
//! request, and the check each kind of operation makes (etcd's rules).

use super::records::{
    PermKind, RoleRecord, TokenKey, UserRecord, ENABLED_KEY, PROXY_ROLE, ROLE_PREFIX, ROOT,
    TOKEN_KEY_PREFIX, USER_PREFIX,
};
use crate::etcdpb::{PbDeleteRequest, PbPutRequest, PbRangeRequest, PbTxnOpRequest, PbTxnRequest};
use crate::key_range::KeyRange;
use crate::ApiError;
use std::collections::BTreeMap;
use std::sync::Arc;

/// What an operation needs on the keys it touches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    Read,
    Write,
}

impl PermKind {
    fn grants(self, need: Need) -> bool {
        matches!(
            (self, need),
            (PermKind::ReadWrite, _)
                | (PermKind::Read, Need::Read)
                | (PermKind::Write, Need::Write)
        )
    }
}

/// The auth records at one auth version.
#[derive(Debug, Clone, Default)]
pub struct AuthView {
    /// The mod revision of the version key (0: auth never configured).
    pub version: i64,
    pub enabled: bool,
    pub users: BTreeMap<String, UserRecord>,
    pub roles: BTreeMap<String, RoleRecord>,
    /// Oldest first; the last one signs.
    pub token_keys: Vec<TokenKey>,
}

impl AuthView {
    /// The view of the records under the auth prefix, as `(key, value)`.
    /// A record that does not decode is skipped with an error log: only
    /// latchkey writes them, so one that does not decode is damage, and
    /// skipping it denies rather than grants.
    pub fn from_records<'a>(
        version: i64,
        records: impl IntoIterator<Item = (&'a [u8], &'a [u8])>,
    ) -> AuthView {
        let mut view = AuthView {
            version,
            ..AuthView::default()
        };
        for (key, value) in records {
            let decoded = if key == ENABLED_KEY {
                view.enabled = true;
                Ok(())
            } else if key.starts_with(USER_PREFIX) {
                serde_json::from_slice::<UserRecord>(value).map(|u| {
                    view.users.insert(u.name.clone(), u);
                })
            } else if key.starts_with(ROLE_PREFIX) {
                serde_json::from_slice::<RoleRecord>(value).map(|r| {
                    view.roles.insert(r.name.clone(), r);
                })
            } else if key.starts_with(TOKEN_KEY_PREFIX) {
                serde_json::from_slice::<TokenKey>(value).map(|k| view.token_keys.push(k))
            } else {
                Ok(())
            };
            if let Err(e) = decoded {
                tracing::error!(key = %key.escape_ascii(), error = %e, "auth record does not decode; skipped");
            }
        }
        view.token_keys.sort_by_key(|k| k.id);
        view
    }

    /// Who sends a request carrying `token` (`None`: no token), checked
    /// against this view: anyone while authentication is off; else the
    /// token's user, if one of this view's keys signed it, it has not
    /// expired, the user still exists and its password has not changed
    /// since.
    pub fn caller(
        self: &Arc<Self>,
        token: Option<&str>,
        now_unix_ms: u64,
    ) -> Result<Caller, ApiError> {
        if !self.enabled {
            return Ok(Caller::Anyone);
        }
        let token = token.ok_or_else(ApiError::user_empty)?;
        let token = token.strip_prefix("Bearer ").unwrap_or(token).trim();
        let claims = super::token::verify(&self.token_keys, token, now_unix_ms)?;
        let user = self
            .users
            .get(&claims.user)
            .ok_or_else(|| ApiError::invalid_auth_token("invalid auth token: the user is gone"))?;
        if user.fingerprint() != claims.password {
            return Err(ApiError::invalid_auth_token(
                "invalid auth token: the password changed since; authenticate again",
            ));
        }
        Ok(Caller::User {
            view: self.clone(),
            name: claims.user,
        })
    }

    /// Whether `user` (empty: a reader that began while authentication
    /// was off) may still read `range` (or, with `admin`, still holds the
    /// root role) by this view: how a proxy's shared watches, begun after
    /// a check with the client's token, are checked again when the records
    /// change (a token may have expired since; the user it named is what
    /// counts, as for a member's own watch streams).
    pub fn may_still_read(
        self: &Arc<Self>,
        user: &str,
        range: &KeyRange,
        admin: bool,
    ) -> Result<(), ApiError> {
        if !self.enabled {
            return Ok(());
        }
        if user.is_empty() {
            return Err(ApiError::user_empty());
        }
        if !self.users.contains_key(user) {
            return Err(ApiError::invalid_auth_token(
                "invalid auth token: the user is gone",
            ));
        }
        let caller = Caller::User {
            view: self.clone(),
            name: user.to_string(),
        };
        if admin {
            caller.require_admin("the audit stream")
        } else {
            caller.require(Need::Read, range)
        }
    }

    /// Whether `user` holds the root role.
    pub fn is_admin(&self, user: &str) -> bool {
        self.users.get(user).is_some_and(|u| u.roles.contains(ROOT))
    }

    /// Whether `user`'s roles cover every key of `range` for `need`.
    /// Root is not special here: [`Caller`] lets it through first.
    pub fn permits(&self, user: &str, need: Need, range: &KeyRange) -> bool {
        let Some(u) = self.users.get(user) else {
            return false;
        };
        // The request as [start, end) with `None` for "no end".
        let (start, end): (&[u8], Option<Vec<u8>>) = if range.end.is_empty() || range.is_empty() {
            let mut next = range.start.clone();
            next.push(0);
            (&range.start, Some(next))
        } else if range.end == [0] {
            (&range.start, None)
        } else {
            (&range.start, Some(range.end.clone()))
        };
        let mut granted: Vec<(&[u8], Option<Vec<u8>>)> = u
            .roles
            .iter()
            .filter_map(|r| self.roles.get(r))
            .flat_map(|r| &r.perms)
            .filter(|p| p.kind.grants(need))
            .map(|p| {
                let end = if p.range_end.is_empty() {
                    let mut next = p.key.clone();
                    next.push(0);
                    Some(next)
                } else if p.range_end == [0] {
                    None
                } else {
                    Some(p.range_end.clone())
                };
                (p.key.as_slice(), end)
            })
            .collect();
        granted.sort_by(|a, b| a.0.cmp(b.0));
        // Walk the granted intervals in order, extending what is covered
        // from `start`; a gap before `end` denies.
        let mut covered: Vec<u8> = start.to_vec();
        for (lo, hi) in granted {
            if lo > covered.as_slice() {
                break;
            }
            match hi {
                None => return true,
                Some(hi) if hi > covered => covered = hi,
                Some(_) => {}
            }
            if end.as_ref().is_some_and(|e| covered >= *e) {
                return true;
            }
        }
        false
    }
}

/// Who sent a request.
#[derive(Debug, Clone)]
pub enum Caller {
    /// Authentication is off: everyone may do everything, except touch
    /// the auth records and write latchkey's own records.
    Anyone,
    /// Authentication is off and the request carries the proxies' key
    /// ([`proxy_key`](super::proxy_key)): as [`Caller::Anyone`], and it
    /// writes latchkey's own records.
    Proxy,
    /// An authenticated user, checked against the view its token was
    /// verified with.
    User { view: Arc<AuthView>, name: String },
}

impl Caller {
    pub fn name(&self) -> Option<&str> {
        match self {
            Caller::Anyone | Caller::Proxy => None,
            Caller::User { name, .. } => Some(name),
        }
    }

    pub fn is_admin(&self) -> bool {
        match self {
            Caller::Anyone | Caller::Proxy => true,
            Caller::User { view, name } => view.is_admin(name),
        }
    }

    /// Refuses unless the caller may do everything: membership,
    /// maintenance, auth changes, force-release.
    pub fn require_admin(&self, what: &str) -> Result<(), ApiError> {
        if self.is_admin() {
            return Ok(());
        }
        Err(ApiError::permission_denied(format!(
            "{what} needs the root role; user {:?} does not hold it",
            self.name().unwrap_or_default()
        )))
    }

    /// Refuses unless the caller may `need` every key of `range`.
    pub fn require(&self, need: Need, range: &KeyRange) -> Result<(), ApiError> {
        super::records::refuse_client_access(range)?;
        let Caller::User { view, name } = self else {
            return Ok(());
        };
        if view.is_admin(name) || view.permits(name, need, range) {
            return Ok(());
        }
        let what = match need {
            Need::Read => "read",
            Need::Write => "write",
        };
        Err(ApiError::permission_denied(format!(
            "user {name:?} may not {what} {:?}{}",
            range.start.escape_ascii().to_string(),
            if range.end.is_empty() {
                String::new()
            } else {
                format!(" .. {:?}", range.end.escape_ascii().to_string())
            }
        )))
    }

    pub fn check_range(&self, req: &PbRangeRequest) -> Result<(), ApiError> {
        self.require(Need::Read, &range_of(&req.key, &req.range_end))
    }

    /// Whether the caller may write latchkey's own records under
    /// `\0latchkey/`: a holder of [`PROXY_ROLE`], or, while
    /// authentication is off, a request with the proxies' key. A proxy
    /// writes its records through a cell's client port, where clients
    /// connect too.
    pub fn writes_records(&self) -> bool {
        match self {
            Caller::Anyone => false,
            Caller::Proxy => true,
            Caller::User { view, name } => view
                .users
                .get(name)
                .is_some_and(|u| u.roles.contains(PROXY_ROLE)),
        }
    }

    /// Write on the key; read as well when the previous value is asked for.
    /// A reserved key only for [`writes_records`](Self::writes_records).
    pub fn check_put(&self, req: &PbPutRequest) -> Result<(), ApiError> {
        let range = range_of(&req.key, &[]);
        self.require(Need::Write, &range)?;
        if !self.writes_records() {
            crate::reserved::check_put(req)?;
        }
        if req.prev_kv {
            self.require(Need::Read, &range)?;
        }
        Ok(())
    }

    pub fn check_delete(&self, req: &PbDeleteRequest) -> Result<(), ApiError> {
        let range = range_of(&req.key, &req.range_end);
        self.require(Need::Write, &range)?;
        if !self.writes_records() {
            crate::reserved::check_delete(req)?;
        }
        if req.prev_kv {
            self.require(Need::Read, &range)?;
        }
        Ok(())
    }

    /// Read on every compared key; each operation of both branches as if
    /// sent alone, nested txns too.
    pub fn check_txn(&self, req: &PbTxnRequest) -> Result<(), ApiError> {
        for compare in &req.compare {
            self.require(Need::Read, &range_of(&compare.key, &compare.range_end))?;
        }
        for op in req.success.iter().chain(&req.failure) {
            match &op.request {
                Some(PbTxnOpRequest::RequestRange(r)) => self.check_range(r)?,
                Some(PbTxnOpRequest::RequestPut(p)) => self.check_put(p)?,
                Some(PbTxnOpRequest::RequestDeleteRange(d)) => self.check_delete(d)?,
                Some(PbTxnOpRequest::RequestTxn(t)) => self.check_txn(t)?,
                None => {}
            }
        }
        Ok(())
    }
}

pub fn range_of(key: &[u8], end: &[u8]) -> KeyRange {
    KeyRange::new(key.to_vec(), end.to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::records::PermRecord;
    use crate::ErrorCode;

    fn view() -> Arc<AuthView> {
        let perm = |kind, key: &[u8], end: &[u8]| PermRecord {
            kind,
            key: key.to_vec(),
            range_end: end.to_vec(),
        };
        let role = |name: &str, perms| {
            (
                name.to_string(),
                RoleRecord {
                    name: name.to_string(),
                    perms,
                },
            )
        };
        let user = |name: &str, roles: &[&str]| {
            (
                name.to_string(),
                UserRecord {
                    name: name.to_string(),
                    password_hash: None,
                    roles: roles.iter().map(|r| r.to_string()).collect(),
                },
            )
        };
        Arc::new(AuthView {
            version: 1,
            enabled: true,
            users: [
                user("root", &["root"]),
                user("reader", &["config-read"]),
                user("worker", &["jobs-rw", "a-to-m"]),
                user("none", &[]),
                user("proxy", &["root", PROXY_ROLE]),
            ]
            .into(),
            roles: [
                role("root", vec![]),
                role(
                    "config-read",
                    vec![perm(PermKind::Read, b"config/", b"config0")],
                ),
                role(
                    "jobs-rw",
                    vec![
                        perm(PermKind::ReadWrite, b"jobs/", b"jobs0"),
                        perm(PermKind::Write, b"one", b""),
                    ],
                ),
                role(
                    "a-to-m",
                    vec![
                        perm(PermKind::Read, b"a", b"f"),
                        perm(PermKind::Read, b"e", b"m"),
                    ],
                ),
            ]
            .into(),
            token_keys: vec![],
        })
    }

    fn caller(name: &str) -> Caller {
        Caller::User {
            view: view(),
            name: name.to_string(),
        }
    }

    fn r(start: &[u8], end: &[u8]) -> KeyRange {
        range_of(start, end)
    }

    #[test]
    fn permissions_cover_exactly_their_ranges() {
        let reader = caller("reader");
        assert!(reader.require(Need::Read, &r(b"config/a", b"")).is_ok());
        assert!(reader
            .require(Need::Read, &r(b"config/", b"config0"))
            .is_ok());
        assert!(reader
            .require(Need::Read, &r(b"config/a", b"config/b"))
            .is_ok());
        let e = reader
            .require(Need::Write, &r(b"config/a", b""))
            .expect_err("read only");
        assert_eq!(e.code, ErrorCode::PermissionDenied);
        assert!(reader.require(Need::Read, &r(b"config", b"")).is_err());
        assert!(reader.require(Need::Read, &r(b"config/", &[0])).is_err());
        assert!(reader
            .require(Need::Read, &r(b"config/", b"config1"))
            .is_err());
        assert!(reader.require(Need::Read, &r(b"jobs/x", b"")).is_err());

        let worker = caller("worker");
        assert!(worker.require(Need::Write, &r(b"jobs/1", b"")).is_ok());
        assert!(worker.require(Need::Read, &r(b"jobs/", b"jobs0")).is_ok());
        assert!(worker.require(Need::Write, &r(b"one", b"")).is_ok());
        assert!(worker.require(Need::Read, &r(b"one", b"")).is_err());
        assert!(worker.require(Need::Write, &r(b"one", b"onf")).is_err());
        // Two overlapping grants cover their union, and no more.
        assert!(worker.require(Need::Read, &r(b"b", b"l")).is_ok());
        assert!(worker.require(Need::Read, &r(b"a", b"m")).is_ok());
        assert!(worker.require(Need::Read, &r(b"a", b"n")).is_err());

        let none = caller("none");
        assert!(none.require(Need::Read, &r(b"config/a", b"")).is_err());
        assert!(caller("gone").require(Need::Read, &r(b"a", b"")).is_err());
        assert!(caller("root").require(Need::Write, &r(b"\0", &[0])).is_ok());
        assert!(Caller::Anyone.require(Need::Write, &r(b"x", b"")).is_ok());
    }

    #[test]
    fn a_reader_is_checked_again_by_its_user_name() {
        let v = view();
        let config = r(b"config/a", b"");
        assert!(v.may_still_read("reader", &config, false).is_ok());
        let e = v
            .may_still_read("reader", &r(b"jobs/", b"jobs0"), false)
            .unwrap_err();
        assert_eq!(e.code, ErrorCode::PermissionDenied);
        let e = v.may_still_read("reader", &config, true).unwrap_err();
        assert_eq!(e.code, ErrorCode::PermissionDenied, "not root");
        let e = v.may_still_read("gone", &config, false).unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidAuthToken);
        let e = v.may_still_read("", &config, false).unwrap_err();
        assert_eq!(e.code, ErrorCode::UserEmpty);
        assert!(v
            .may_still_read("root", &r(b"jobs/", b"jobs0"), false)
            .is_ok());
        assert!(v.may_still_read("root", &config, true).is_ok());
        let off = Arc::new(AuthView::default());
        assert!(off.may_still_read("", &config, true).is_ok());
    }

    #[test]
    fn admin_is_the_root_role_and_nobody_reaches_the_auth_records() {
        assert!(caller("root").require_admin("snapshot").is_ok());
        assert!(Caller::Anyone.require_admin("snapshot").is_ok());
        let e = caller("worker")
            .require_admin("snapshot")
            .expect_err("not admin");
        assert_eq!(e.code, ErrorCode::PermissionDenied);
        assert!(e.message.contains("snapshot"), "{}", e.message);
        for who in [caller("root"), Caller::Anyone] {
            let e = who
                .require(Need::Read, &r(b"\0latchkey/auth/user/root", b""))
                .expect_err("auth records");
            assert_eq!(e.code, ErrorCode::PermissionDenied);
        }
    }

    #[test]
    fn only_the_proxy_role_writes_latchkeys_records_once_authentication_is_on() {
        let forged = PbPutRequest {
            key: b"\0latchkey/audit/forged".to_vec(),
            ..Default::default()
        };
        let e = caller("root").check_put(&forged).expect_err("root forges");
        assert_eq!(e.code, ErrorCode::InvalidArgument);
        assert!(caller("proxy").check_put(&forged).is_ok());
        // Authentication off: the proxies' key, not just anyone.
        assert!(Caller::Proxy.check_put(&forged).is_ok());
        let e = Caller::Anyone
            .check_put(&forged)
            .expect_err("anyone forges");
        assert_eq!(e.code, ErrorCode::InvalidArgument);
        let erase = PbDeleteRequest {
            key: b"\0latchkey/idem/".to_vec(),
            range_end: b"\0latchkey/idem0".to_vec(),
            ..Default::default()
        };
        assert!(caller("root").check_delete(&erase).is_err());
        assert!(caller("proxy").check_delete(&erase).is_ok());
        assert!(Caller::Anyone.check_delete(&erase).is_err());
        assert!(Caller::Proxy.check_delete(&erase).is_ok());
    }

    #[test]
    fn a_txn_is_checked_op_by_op_in_both_branches_and_nested() {
        use crate::etcdpb::{PbCompare, PbTxnRequestOp};
        let put = |key: &[u8]| PbTxnRequestOp {
            request: Some(PbTxnOpRequest::RequestPut(PbPutRequest {
                key: key.to_vec(),
                ..Default::default()
            })),
        };
        let worker = caller("worker");
        let ok = PbTxnRequest {
            compare: vec![PbCompare {
                key: b"jobs/1".to_vec(),
                ..Default::default()
            }],
            success: vec![put(b"jobs/1")],
            failure: vec![put(b"jobs/2")],
        };
        assert!(worker.check_txn(&ok).is_ok());
        // Reading a key only to compare it needs read on it.
        let mut compares_other = ok.clone();
        compares_other.compare[0].key = b"x/1".to_vec();
        assert!(worker.check_txn(&compares_other).is_err());
        let mut nested = ok.clone();
        nested.failure.push(PbTxnRequestOp {
            request: Some(PbTxnOpRequest::RequestTxn(PbTxnRequest {
                success: vec![put(b"config/x")],
                ..Default::default()
            })),
        });
        assert!(worker.check_txn(&nested).is_err());
    }
}
