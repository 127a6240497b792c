//! latchkey-loadtest's integration tests, one binary (STYLE habit 8):
//!
//! - [`cluster`]: `cluster up | down` as an operator runs it;
//! - [`scenarios`]: every load scenario, small, against a real cell and
//!   against etcd;
//! - [`chaos`]: the seeded fault-injection runs and the deliberately
//!   broken builds they must catch.

mod chaos;
mod cluster;
mod common;
mod scenarios;
