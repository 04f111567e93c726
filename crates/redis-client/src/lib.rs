//! # tollgate-redis-client
//!
//! tollgate's Redis client, below the store: which Redis to reach and how (a URL, TLS), one
//! connection per server that batches and bounds every reply, and the topology followed (a Redis
//! Cluster's slot map, a Sentinel group's primary). The store keeps what a decision needs (the
//! script, the keys, the failure policy) and calls through this crate.
