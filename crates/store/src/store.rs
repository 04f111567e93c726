//! The [`Store`] trait: one async interface for every place state can live.

use std::future::Future;

use tollgate_core::{Decision, Limit};

use crate::StoreError;

/// One limit to check as part of a request: the key, its limit, and the cost.
#[derive(Debug, Clone, Copy)]
pub struct Check<'a> {
    /// The key whose state is checked (e.g. `user:42`).
    pub key: &'a str,
    /// The limit for this key; each key may have its own.
    pub limit: &'a Limit,
    /// The cost of the request under this limit (0 peeks).
    pub cost: u64,
}

/// Where rate-limit state lives. Every implementation makes the decisions of `tollgate-core`
/// exactly; the time is the store's own (its clock, or the Redis server's).
///
/// A key's state belongs to the key and the limit's algorithm: the same key checked under two
/// algorithms has two independent states. Within one algorithm, each call's limit applies to
/// the key's state as it is (limits may differ per key and change over time).
pub trait Store: Send + Sync {
    /// Decides a request of `cost` for `key` under `limit`, consuming capacity if admitted.
    /// `cost = 0` peeks: it reports the state, changes nothing and creates no state.
    fn check(&self, key: &str, limit: &Limit, cost: u64) -> impl Future<Output = Result<Decision, StoreError>> + Send;

    /// Decides one request under several limits, all or nothing: the request is admitted only if
    /// every check admits it, and then every check consumed its cost. Otherwise nothing is
    /// consumed; the checks that did not block it report their current state, as a peek would
    /// (`allowed: true`, nothing consumed). See [`all_allowed`].
    fn check_all(&self, checks: &[Check<'_>]) -> impl Future<Output = Result<Vec<Decision>, StoreError>> + Send;

    /// Reports `key`'s state under `limit` without changing it.
    fn peek(&self, key: &str, limit: &Limit) -> impl Future<Output = Result<Decision, StoreError>> + Send {
        self.check(key, limit, 0)
    }

    /// Forgets `key`'s state under `limit`'s algorithm: the key is idle again.
    fn reset(&self, key: &str, limit: &Limit) -> impl Future<Output = Result<(), StoreError>> + Send;
}

/// Whether a [`Store::check_all`] admitted its request.
#[must_use]
pub fn all_allowed(decisions: &[Decision]) -> bool {
    decisions.iter().all(|d| d.allowed)
}
