//! What tests of a Redis client need (feature `testkit`), for this crate's tests and the store's
//! (`tollgate_store::testkit` re-exports it):
//!
//! - [`redis_server`] and [`redis_topology`]: real `redis-server` processes (plain, TLS, with ACL
//!   users), clusters with replicas and Sentinel groups, on free loopback ports, stopped and
//!   cleaned up on drop; [`tls`]: the certificates a test makes for them;
//! - [`fake_redis`]: a fake server whose answers a test scripts (what a broken or hostile server
//!   would say);
//! - [`urls`]: store URLs, well-formed and not, whose credentials must reach no message.

pub mod fake_redis;
pub mod redis_server;
pub mod redis_topology;
pub mod tls;
pub mod urls;
