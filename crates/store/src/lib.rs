//! # tollgate-store
//!
//! Where tollgate keeps each key's rate-limit state, behind one async [`Store`] trait:
//!
//! - [`MemoryStore`]: the embedded default. Thread-safe (lock-free compare-and-swap for GCRA,
//!   small sharded locks for the other algorithms), bounded in keys with idle keys evicted
//!   first, and driven by an injectable [`Clock`](tollgate_core::Clock).
//! - [`RedisStore`] (feature `redis`): one Redis server, a Redis Cluster or a Sentinel group, plain
//!   or TLS, one atomic script per decision.
//! - [`Leased`]: hot keys decided from slices of their capacity leased with one call
//!   ([`lease`]), at memory speed on Redis without over-granting.
//! - [`Fallback`]: what to answer when a [`Remote`] store (Redis) fails or is slow: fail-open,
//!   fail-closed, or decide locally from the state last seen, charged back later; with a circuit
//!   breaker so that a dead backend costs no timeout per call.
//! - `testkit` (feature `testkit`): the conformance suite every store must pass, written once.
//!
//! Every store makes exactly the decisions of `tollgate-core` (see `docs/SEMANTICS.md`); a store only
//! decides where the state lives and what time it is.
//!
//! ```
//! use tollgate_core::Limit;
//! use tollgate_store::{MemoryStore, Store};
//!
//! # tokio_test_block_on(async {
//! let limiter = MemoryStore::new();
//! let limit = Limit::per_second(10).burst(20).build()?;
//! let decision = limiter.check(b"user:42", &limit, 1).await?;
//! assert!(decision.allowed);
//! assert_eq!(decision.remaining, 19);
//!
//! // The memory store also answers synchronously, without a runtime:
//! let decision = limiter.check_sync(b"user:42", &limit, 1)?;
//! assert_eq!(decision.remaining, 18);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # }).unwrap();
//! # fn tokio_test_block_on<F: std::future::Future>(f: F) -> F::Output {
//! #     tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(f)
//! # }
//! ```

#[cfg(feature = "redis")]
pub mod configured;
mod error;
pub mod fallback;
// The layout of a Redis decision call lives next to the script, in `redis/`, but is built without
// the `redis` feature too: the native module reads it.
#[path = "redis/layout.rs"]
pub mod layout;
pub mod lease;
pub mod memory;
#[cfg(feature = "redis")]
pub mod redis;
pub mod remote;
pub mod reservation;
mod store;
mod table;
#[cfg(feature = "testkit")]
pub mod testkit;

pub use error::StoreError;
pub use fallback::{Breaker, BreakerState, FailurePolicy, Fallback, FallbackStats};
pub use lease::{LeaseMode, LeaseOptions, LeaseStats, Leased, Lessor};

/// The manual's library examples, compiled and run as doctests so that they stay true.
#[cfg(doctest)]
#[doc = include_str!("../../../docs/library.md")]
struct LibraryExamples;

/// The manual's Redis examples, compiled as doctests.
#[cfg(doctest)]
#[doc = include_str!("../../../docs/redis.md")]
struct RedisExamples;
pub use memory::{MemoryStore, MemoryStoreBuilder};
#[cfg(feature = "redis")]
pub use redis::{RedisOptions, RedisStore, RedisTarget, TimeSource, TlsConfig};
pub use remote::{Charge, Domain, Remote, Reply};
pub use reservation::{Refusal, Reservation, Settled};
pub use store::{Check, MAX_HOLD_NS, Refund, Reserved, Store, all_allowed, held_decision};
pub use tollgate_core::{Algorithm, Clock, Decision, Limit, ManualClock, SystemClock};
