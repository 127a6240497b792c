//! Identities and permissions in etcd's model: users with passwords,
//! roles holding read, write or readwrite permissions on key ranges, and
//! the `root` role, which may do everything. Shared by the cell, which
//! stores them and checks every request on its client port, and every
//! tier that checks them.
//!
//! - [`records`]: where they live (keys under `\0latchkey/auth/`, which no
//!   client reads or writes; only the Auth API's one code path writes
//!   them) and how they are encoded;
//! - [`view`]: [`AuthView`], the records at one auth version, and
//!   [`Caller`], who sent a request, with the check each operation makes;
//! - [`password`]: argon2id password hashes;
//! - [`limiter`]: Authenticate attempts per user and per source;
//! - [`proxy_key`]: the key proxies present for their own records while
//!   authentication is off;
//! - [`token`]: signed tokens, which whoever holds the keys verifies
//!   without asking anyone.

pub mod limiter;
pub mod password;
pub mod proxy_key;
pub mod records;
pub mod token;
pub mod view;

pub use view::{AuthView, Caller, Need};
