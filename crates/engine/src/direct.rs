//! The server's direct checks, through the same store and metrics as the rules: ad-hoc limits
//! (`CL.THROTTLE`, `TG.CHECK`, inline HTTP limits, sharing state per algorithm and key as
//! redis-cell does) and named limits (`TG.LIMIT name key`, HTTP `limit_name`): a rule keyed on
//! the caller's key, in the rule's own scope, admitted as a request is (mitigation, rates,
//! actions, metrics: see [`Engine::check_named`]).
//!
//! [`Engine`]'s methods here: [`Engine::check_adhoc`], [`Engine::check_named`] and
//! [`Engine::reset`], the calls a front end makes naming a limit rather than sending a request.

use tollgate_core::{Decision, Limit};
use tollgate_rules::Plan;
use tollgate_store::{Check, Store, StoreError};

use crate::{Admission, Answer, Engine, Frontend, Source};

/// The limit `rule`'s state is decided under by a call that does not wait (a peek, a
/// reservation): a delay rule's state is its GCRA shaper's, taken at its own width (what is left
/// without a wait); any other rule's is its limit's.
pub(crate) fn unwaited_limit(rule: &tollgate_rules::Rule) -> Limit {
    match rule.action {
        tollgate_rules::Action::Delay { .. } => rule.shaper(0).unwrap_or_else(|| rule.limit.clone()),
        _ => rule.limit.clone(),
    }
}

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
    /// The store failed and the rules' `on_error` refuses requests then.
    #[error("{0}")]
    Unavailable(String),
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

    /// Decides `cost` for the caller's `key` under the rule or named limit `name` (keyed on the
    /// caller's key), timed as `frontend`'s decision, through the same admission as a request:
    /// the rule's mitigation in force (its `timeout`), `when_rate_above`, its action and metrics.
    /// A caller naming a rule is the application itself, so it is told the decision: `reject`,
    /// `shadow-ban` and `route` answer denied (the application fakes the success of a shadow-ban
    /// if it wants one); `dry-run` answers admitted with what the rule would have said; `delay`
    /// answers admitted once the slot has come; a store error follows the rules' `on_error`.
    /// What a `count_status` rule reserves stays counted (a caller naming a rule has no response
    /// status). A peek (`cost` 0) reports the state without counting anything.
    pub async fn check_named(
        &self,
        frontend: Frontend,
        name: &str,
        key: &[u8],
        cost: u64,
    ) -> Result<(Decision, Limit), EngineError> {
        let policy = self.policy.load_full();
        let (index, rule) = policy.rules.named(name).ok_or_else(|| EngineError::UnknownRule(name.to_string()))?;
        if !rule.keyed_on_callers_key() {
            return Err(EngineError::NotByName(name.to_string()));
        }
        let limit = rule.limit.clone();
        if cost == 0 {
            Box::pin(self.carry_key(&policy, index, key, self.clock.now_ns())).await;
            let peeked = unwaited_limit(rule);
            let check = Check::new(key, &peeked, 0).scoped(&rule.name);
            let decided = self.timed(frontend, self.store.check_one(check)).await;
            return Ok((self.counted(decided)?, limit));
        }
        let mut plan = Plan::default();
        policy.rules.plan_named(index, key, cost, &mut plan);
        let admission = self.timed(frontend, self.decide_plan(&policy, None, &plan, Ok(()), self.max_wait_ns)).await;
        let decision = match admission {
            Admission::Proceed(mut proceed) => {
                proceed.wait().await;
                let decision = proceed.tightest.or(proceed.rare.as_ref().and_then(|rare| rare.dry_run)).map(|(_, d)| d);
                self.keep(proceed.pending);
                // Admitted without a decision: the store failed and `on_error = "allow"`.
                decision.unwrap_or(Decision {
                    allowed: true,
                    limit: limit.capacity(),
                    remaining: 0,
                    retry_after_ns: 0,
                    reset_after_ns: 0,
                })
            }
            Admission::Answer(Answer::TooMany(fields) | Answer::Route { fields, .. }) => fields.decision,
            Admission::Answer(Answer::ShadowBan { fields, .. }) => fields.decision,
            Admission::Answer(Answer::Unavailable(message) | Answer::BadRequest(message)) => {
                return Err(EngineError::Unavailable(message));
            }
        };
        Ok((decision, limit))
    }

    /// Forgets the state of `key` in `scope` under `limit`'s algorithm, and its hold in `scope`
    /// (a rule's name): in the store, and in this engine's table (another engine sharing the store
    /// keeps the hold it knows until it ends).
    pub async fn reset(&self, scope: &str, key: &[u8], limit: &Limit) -> Result<(), StoreError> {
        self.blocks.unblock(scope, key);
        self.metrics.blocked.set(i64::try_from(self.blocks.len()).unwrap_or(i64::MAX));
        self.counted(self.store.reset(scope, key, limit).await)
    }
}
