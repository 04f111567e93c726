//! The measured rates as the engine reads them: `Engine::measure` counts a request in the rate
//! of each measured rule of its plan (what `when_rate_above`, dry-run's log lines and the
//! answers' fields read), and [`Engine::top`] reports a rule's busiest keys. The estimator and
//! its bounded table are in [`rates`](crate::rates).

use smallvec::SmallVec;
use tollgate_rules::Plan;
use tollgate_store::Store;

use crate::rates::{Measured, Talker};
use crate::{Engine, EngineError, Policy};

/// The measured rate of each rule of a plan, in plan order (`None` for a rule not measured;
/// empty when no rule is).
pub(crate) type Rates = SmallVec<[Option<Measured>; 4]>;

/// The rate of the plan's `i`-th rule, if measured.
pub(crate) fn rate(rates: &Rates, i: usize) -> Option<f64> {
    rates.get(i).copied().flatten().map(|m| m.rate)
}

impl<S: Store> Engine<S> {
    /// Counts the request, arrived at `now` (read only if a rule measures it), in the measured
    /// rate of every measured rule of `plan` (none if it was refused).
    pub(crate) fn measure(&self, policy: &Policy, plan: &Plan, planned: bool, now: impl FnOnce() -> u64) -> Rates {
        if !planned || !policy.measures || plan.is_empty() {
            return Rates::new();
        }
        let now = now();
        plan.iter()
            .map(|(rule, key, cost)| {
                let r = &policy.rules.rules[rule];
                r.measured.then(|| self.rates.record(&policy.names[rule], r.rate_half_life_ns, key, cost, now))
            })
            .collect()
    }

    /// The keys of rule `name` with the highest measured rates, highest first (at most `n`, at
    /// most 100).
    pub fn top(&self, name: &str, n: usize) -> Result<Vec<Talker>, EngineError> {
        let policy = self.policy.load();
        let (_, rule) = policy.rules.named(name).ok_or_else(|| EngineError::UnknownRule(name.to_string()))?;
        if !rule.measured {
            return Err(EngineError::NotMeasured(name.to_string()));
        }
        Ok(self.rates.top(name, n, rule.when_rate_above, self.clock.now_ns()))
    }
}
