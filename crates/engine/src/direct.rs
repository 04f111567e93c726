//! The server's direct checks, through the same store and metrics as the rules: ad-hoc limits
//! (`CL.THROTTLE`, `TG.CHECK`, inline HTTP limits, sharing state per algorithm and key as
//! redis-cell does) and named limits (`TG.LIMIT name key`, HTTP `limit_name`): a rule keyed on
//! the caller's key, in the rule's own scope.

use tollgate_core::{Decision, Limit};
use tollgate_store::{Check, Store, StoreError};

use crate::{Engine, Frontend, Outcome, Source};

/// Why a direct check could not be decided.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// No rule of that name.
    #[error("no rule or limit named {0:?}")]
    UnknownRule(String),
    /// The rule keys on request characteristics (client IP, headers...), which a caller naming a
    /// key does not have.
    #[error(
        "rule {0:?} keys on request characteristics, not on a caller's key (key = [\"key\"]): it cannot be checked by name"
    )]
    NotByName(String),
    /// The rule's keys have no measured rate: it sets neither `rate_half_life` nor
    /// `when_rate_above`, and is neither dry-run nor route.
    #[error(
        "rule {0:?} does not measure its keys' rates: give it rate_half_life = \"2s\" (or when_rate_above, or action dry-run or route)"
    )]
    NotMeasured(String),
    /// The store failed or refused the request.
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl<S: Store> Engine<S> {
    /// Decides `cost` for `key` under an ad-hoc `limit` (a peek when `cost` is 0, not counted;
    /// timed either way, as `source`'s front end's).
    pub async fn check_adhoc(
        &self,
        source: Source,
        key: &[u8],
        limit: &Limit,
        cost: u64,
    ) -> Result<Decision, StoreError> {
        let decided = self.timed(source.frontend(), self.store.check(key, limit, cost)).await;
        let decision = self.counted(decided)?;
        if cost > 0 {
            self.metrics.count_adhoc(source, limit.algorithm(), decision.allowed);
        }
        Ok(decision)
    }

    /// Decides `cost` for `key` under the rule or named limit `name`, in its scope, timed as
    /// `frontend`'s decision.
    pub async fn check_named(
        &self,
        frontend: Frontend,
        name: &str,
        key: &[u8],
        cost: u64,
    ) -> Result<(Decision, Limit), EngineError> {
        let policy = self.policy.load();
        let (index, rule) = policy.rules.named(name).ok_or_else(|| EngineError::UnknownRule(name.to_string()))?;
        if !rule.keyed_on_callers_key() {
            return Err(EngineError::NotByName(name.to_string()));
        }
        let check = Check::new(key, &rule.limit, cost).scoped(&rule.name);
        let decided = self.timed(frontend, self.store.check_one(check)).await;
        let decision = self.counted(decided)?;
        if cost > 0 {
            let outcome = if decision.allowed { Outcome::Allowed } else { Outcome::Rejected };
            self.metrics.count(&policy.counters[index], outcome);
        }
        Ok((decision, rule.limit.clone()))
    }

    /// Forgets the state of `key` in `scope` under `limit`'s algorithm.
    pub async fn reset(&self, scope: &str, key: &[u8], limit: &Limit) -> Result<(), StoreError> {
        self.counted(self.store.reset(scope, key, limit).await)
    }
}
