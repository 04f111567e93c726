//! # tollgate-redis-client
//!
//! tollgate's Redis client, below the store (which keeps what a decision needs: the script, the
//! keys, the failure policy, and calls through this crate):
//!
//! - **Where.** One server, a Redis Cluster or the primary of a Sentinel group, plain or TLS, as
//!   a [`RedisTarget`] says (parsed from `redis://`, `rediss+cluster://`, `redis+sentinel://`…
//!   URLs: `target.rs`). The topology is followed here: a cluster's slot map is kept current
//!   through failovers and reshards (`MOVED`, `ASK`, `READONLY`: `cluster.rs`), a Sentinel
//!   group's primary through its switches (`sentinel.rs`); what both share is `follow.rs`.
//! - **One connection per server** (`node.rs`, `link.rs`): made on first use and again after it
//!   breaks, TLS and ACL user as the target says; the calls ready in the same instant go out in
//!   one write (`wire.rs`), and every reply is bounded before it is parsed (`bounded.rs`), then
//!   read by the workspace's RESP reader where it can (`reply.rs`).
//! - **Scripts** ([`Script`]): a Lua program runs as a Redis Function where the server has them,
//!   by `EVALSHA` where it does not, and through a [`Native`] command (a module's) where one is
//!   loaded.
//! - **Trust no server reply** (`topology.rs`): every value a server sends about the topology
//!   (slots, redirects, addresses, roles) is checked before it is used; an impossible one fails
//!   its call, never the process.
//! - **A call is sent at most once** where it may have run: a failed call says what it may
//!   have done ([`CallError::delivery`]), and the client never sends it again.
//!
//! Tests: `testkit` (feature `testkit`) starts real `redis-server` processes, clusters and
//! Sentinel groups, and a fake server whose answers a test scripts; `fuzzing` (feature
//! `fuzzing`) holds the bodies of this crate's fuzz targets (`fuzz/`).

mod bounded;
mod cluster;
mod connection;
mod error;
mod follow;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
mod link;
mod node;
mod reply;
mod script;
mod sentinel;
mod slot;
pub mod target;
#[cfg(feature = "testkit")]
pub mod testkit;
mod topology;
mod wire;

pub use connection::Connection;
pub use error::{CallError, Delivery, Error};
pub use script::{Native, Script};
pub use slot::{SLOTS, slot};
pub use target::{Address, RedisTarget, TlsConfig, Topology, redacted};
