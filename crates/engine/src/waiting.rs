//! Requests waiting for their slot under a `delay` rule. A request may wait no longer than the
//! rule's `max_delay`, than the time its front end gives it (the server's request timeout: a wait
//! that would not end before it is refused at once), and only while fewer than
//! [`EngineBuilder::max_delayed`](crate::EngineBuilder::max_delayed) requests wait, across every
//! key: otherwise it is admitted only if it need not wait. Each bound narrows the rule's shaper
//! for that request ([`Rule::shaper`]: one GCRA schedule, any width), so a request refused by one
//! is refused by the store itself and charges nothing.
//!
//! [`Rule::shaper`]: tollgate_rules::Rule::shaper

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tollgate_core::{Decision, Limit};
use tollgate_rules::Action;

use crate::Policy;

/// How many requests may wait for their slot at once, by default, across every key.
pub const DEFAULT_MAX_DELAYED: usize = 1024;

/// The places of the requests waiting for their slot.
#[derive(Debug)]
pub(crate) struct Places {
    taken: Arc<AtomicUsize>,
    max: usize,
}

/// A request's place among those waiting for their slot, given back when dropped.
#[derive(Debug)]
pub(crate) struct Waiting(Arc<AtomicUsize>);

impl Drop for Waiting {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Places {
    pub(crate) fn new(max: usize) -> Self {
        Places { taken: Arc::new(AtomicUsize::new(0)), max }
    }

    /// A place, if one is free.
    pub(crate) fn take(&self) -> Option<Waiting> {
        let max = self.max;
        self.taken
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |taken| (taken < max).then_some(taken + 1))
            .ok()
            .map(|_| Waiting(self.taken.clone()))
    }
}

/// Whether rule `rule` delays what is over it.
pub(crate) fn delays(policy: &Policy, rule: usize) -> bool {
    matches!(policy.rules.rules[rule].action, Action::Delay { .. })
}

/// Whether `decision`, delay rule `rule`'s refusal of a request that had no place among those
/// waiting (checked as if it could not wait), would have been an admission with a place (a wait
/// within `within_ns` and `max_delay`): the key is not over, too many requests wait.
pub(crate) fn wanted_a_place(policy: &Policy, rule: usize, within_ns: u64, decision: &Decision) -> bool {
    let r = &policy.rules.rules[rule];
    let Action::Delay { max_delay_ns } = r.action else { return false };
    let t = r.limit.emission_interval_ns();
    let slots = max_delay_ns.min(within_ns.saturating_sub(1)) / t;
    slots > 0 && decision.retry_after_ns <= slots.saturating_mul(t)
}

/// The shaper a request checks `rule` (a delay rule) under when it may wait less than the rule's
/// `max_delay`: none when it may wait that long (the policy's own shaper applies). `may_wait`:
/// it holds a place among the requests waiting; `within_ns`: the time it has (its wait must end
/// before).
pub(crate) fn narrowed(policy: &Policy, rule: usize, may_wait: bool, within_ns: u64) -> Option<Limit> {
    let r = &policy.rules.rules[rule];
    let Action::Delay { max_delay_ns } = r.action else { return None };
    let width = if may_wait { max_delay_ns.min(within_ns.saturating_sub(1)) } else { 0 };
    if width >= max_delay_ns {
        return None;
    }
    // A narrower shaper than the full one always builds; the full one is the fallback anyway.
    r.shaper(width)
}
