//! The conformance suite every [`Store`](crate::Store) must pass, written once (feature `testkit`).
//!
//! A store under test is made by a closure from a [`ManualClock`](tollgate_core::ManualClock)
//! the suite controls, so every decision happens at an explicit instant:
//!
//! ```
//! # use std::sync::Arc;
//! # use tollgate_store::{MemoryStore, testkit};
//! # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
//! testkit::conformance(|clock| MemoryStore::builder().clock(clock).build()).await;
//! # });
//! ```
//!
//! - [`traces`]: the shared JSON-lines traces of `testdata/conformance/`, every field checked;
//! - [`cases`]: store-level behaviour the traces cannot express (all-or-nothing multi-key checks,
//!   reset, peeks creating no state, per-key limits, a clock going backwards, bad costs);
//! - [`hammer`]: many concurrent callers on one key, for zero-over-grant tests;
//! - [`faults`]: a remote store whose calls fail on demand, for tests of the failure policy;
//! - [`random`]: a seeded generator and random limits across the whole accepted range;
//! - `redis_server`, `redis_topology`, `tls` and `fake_redis` (with feature `redis`): the Redis
//!   client's (`tollgate_redis_client::testkit`): real `redis-server` processes (plain, TLS, with
//!   ACL users), clusters with replicas, Sentinel groups, the certificates a test makes for them,
//!   and a fake server whose answers a test scripts (what a broken or hostile server would say);
//!   with the store's additions: `redis_module`, tollgate's native module built for the test's
//!   profile, the manual's smallest ACL, the decision script's answer.

pub mod cases;
#[cfg(feature = "redis")]
pub mod fake_redis;
pub mod faults;
pub mod hammer;
pub mod load;
pub mod random;
#[cfg(feature = "redis")]
pub mod redis_module;
#[cfg(feature = "redis")]
pub mod redis_server;
/// Clusters with replicas and Sentinel groups of real servers (the client's).
#[cfg(feature = "redis")]
pub use tollgate_redis_client::testkit::redis_topology;
/// Certificates for the TLS test servers (the client's).
#[cfg(feature = "redis")]
pub use tollgate_redis_client::testkit::tls;
pub mod traces;

use std::sync::Arc;

use tollgate_core::ManualClock;

use crate::Store;

/// Runs the whole suite against stores made by `make`; panics with the first difference.
pub async fn conformance<S: Store>(make: impl Fn(Arc<ManualClock>) -> S) {
    traces::run_all(&make).await;
    cases::run_all(&make).await;
}
