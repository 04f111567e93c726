//! Envoy's descriptors decided under the policy in force ([`Engine::admit_descriptors`]): the
//! policy's Envoy configuration (envoyproxy/ratelimit's YAML, matched by `tollgate-envoy`) gives
//! each descriptor its limit, and the engine decides them as envoyproxy/ratelimit does, with one
//! difference on purpose: a request is all or nothing.
//!
//! Each descriptor is one of:
//! - **free**: no limit applies (an unknown domain, an unmatched descriptor, or a limit another
//!   descriptor's `replaces` drops): OK, without a limit;
//! - **unlimited** (`unlimited: true`): OK, never counted;
//! - **blocked**: `requests_per_unit: 0`, or more hits than its limit can ever admit: over the
//!   limit without asking the store (for the store such a cost would be an error, failing the
//!   whole call open in Envoy);
//! - **checked**: decided by the store, enforced or in `shadow_mode`.
//!
//! A blocked or checked descriptor may be in `quota_mode`: as in envoyproxy/ratelimit, a request
//! is refused when an enforced descriptor not in quota mode is over its limit, or when every
//! quota-mode descriptor of the request is over its own; otherwise it is admitted, and a
//! quota-mode descriptor over its limit reports itself over (OVER_LIMIT in its status) in a
//! request that is admitted. A quota-mode descriptor in shadow mode is never over (as
//! envoyproxy/ratelimit answers a shadow limit OK), so its request always has a quota within.
//!
//! The enforced checks are admitted together in one store call, so a request over any of its
//! limits (a blocked one included) consumes nothing from the others (envoyproxy/ratelimit counts
//! every descriptor, and a request refused by one still uses up its siblings); shadow-mode limits
//! never refuse: they are counted when the request is admitted and report what they would have
//! said (see `asks`). With quota mode, the same holds: a refused request consumes nothing
//! anywhere; an admitted one consumes on every enforced descriptor and on each quota-mode
//! descriptor within its limit, never on one over it (a quota check found over leaves the
//! all-or-nothing call, which is made again without it: no charge is ever undone; see `asks`
//! for the rounds and what a concurrent request may see between them). Every decision is timed as gRPC's ([`Frontend::Grpc`]), its store errors
//! counted, and its hits counted in envoyproxy/ratelimit's per-limit counters
//! ([`DescriptorMetrics`](crate::metrics::DescriptorMetrics)). Envoy's state lives in its own
//! scope ([`ENVOY_SCOPE`]), apart from rules, named limits and ad-hoc keys, on the store given to
//! [`EngineBuilder::envoy_store`](crate::EngineBuilder::envoy_store) (by default the engine's).
//!
//! [`Engine`]'s method here: [`Engine::admit_descriptors`].

use tollgate_core::Decision;
use tollgate_envoy::{Matched, RateLimit, Unit};
use tollgate_rules::ENVOY_SCOPE;
use tollgate_store::{Check, Store, StoreError};

use crate::asks::{self, Ask};
use crate::metrics::DescriptorOutcome;
use crate::{Engine, Frontend};

/// One descriptor of a request, as its front end read it.
#[derive(Debug, Clone, Default)]
pub struct Descriptor<'a> {
    /// Its entries, key and value, in order.
    pub entries: Vec<(&'a str, &'a str)>,
    /// Its own `hits_addend`, instead of the request's (0 checks without counting).
    pub hits_addend: Option<u64>,
    /// Its `limit` override ([`RateLimit::from_override`]), instead of the configured limit.
    pub limit: Option<RateLimit>,
}

/// A descriptor's limit as the answer states it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatedLimit {
    /// Its `name` (empty without one).
    pub name: String,
    /// Its `requests_per_unit`.
    pub requests_per_unit: u32,
    /// Its `unit`.
    pub unit: Unit,
}

/// What the engine decided for one descriptor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// No limit applies: OK, without a limit.
    Free,
    /// `unlimited: true`: OK, never counted.
    Unlimited,
    /// Under a limit.
    Limited {
        /// The limit (configured, or the request's override).
        limit: StatedLimit,
        /// Whether the descriptor is over its limit (never in shadow mode).
        over: bool,
        /// Its state after the request (consumed only if the request was admitted); none for a
        /// blocked descriptor, which is never asked for.
        decision: Option<Decision>,
    },
}

/// What the engine decided for a request's descriptors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdicts {
    /// Whether the request was admitted: no descriptor over its limit, but those in
    /// `quota_mode` while one of them is within.
    pub admitted: bool,
    /// One per descriptor, in order.
    pub verdicts: Vec<Verdict>,
    /// The descriptors whose limit is in `quota_mode` (by index, ascending; never a free or
    /// unlimited one): those of them [`Verdict::Limited`] with `over` are over their quota.
    pub quota: Vec<usize>,
}

/// How one descriptor is decided.
enum Plan<'a> {
    Free,
    Unlimited,
    Blocked { limit: StatedLimit, shadow: bool, quota: bool, metric: &'a str, hits: u64 },
    Checked { check: Check<'a>, limit: StatedLimit, shadow: bool, quota: bool, metric: &'a str },
}

impl Plan<'_> {
    /// Whether the descriptor has a limit in `quota_mode`.
    fn quota(&self) -> bool {
        matches!(self, Plan::Blocked { quota: true, .. } | Plan::Checked { quota: true, .. })
    }

    /// Whether the descriptor has a limit in `shadow_mode`.
    fn shadow(&self) -> bool {
        matches!(self, Plan::Blocked { shadow: true, .. } | Plan::Checked { shadow: true, .. })
    }
}

/// One descriptor's plan from the limit it matched (configured or its override), for `hits`.
fn plan<'a>(matched: Option<&'a Matched<'a>>, hits: u64) -> Plan<'a> {
    let Some(m) = matched else { return Plan::Free };
    if m.limit.unlimited {
        return Plan::Unlimited;
    }
    let limit = StatedLimit {
        name: m.limit.name.clone().unwrap_or_default(),
        requests_per_unit: m.limit.requests_per_unit,
        unit: m.limit.unit,
    };
    let (shadow, quota, metric) = (m.limit.shadow_mode, m.limit.quota_mode, m.metric_key.as_str());
    match &m.limit.limit {
        Some(checked) if hits <= checked.capacity() => {
            Plan::Checked { check: Check::new(&m.key, checked, hits).scoped(ENVOY_SCOPE), limit, shadow, quota, metric }
        }
        // `requests_per_unit: 0`, or more than the limit can ever admit.
        _ => Plan::Blocked { limit, shadow, quota, metric, hits },
    }
}

impl<S: Store> Engine<S> {
    /// Decides the `descriptors` of a request to Envoy's rate-limit service in `domain`, each
    /// costing `hits_addend` (0 means 1) unless it has its own (see the module docs).
    pub async fn admit_descriptors(
        &self,
        domain: &str,
        descriptors: &[Descriptor<'_>],
        hits_addend: u32,
    ) -> Result<Verdicts, StoreError> {
        self.timed(Frontend::Grpc, self.decide_descriptors(domain, descriptors, hits_addend)).await
    }

    /// [`admit_descriptors`](Self::admit_descriptors), untimed.
    async fn decide_descriptors(
        &self,
        domain: &str,
        descriptors: &[Descriptor<'_>],
        hits_addend: u32,
    ) -> Result<Verdicts, StoreError> {
        let policy = self.policy();
        let entries: Vec<&[(&str, &str)]> = descriptors.iter().map(|d| d.entries.as_slice()).collect();
        let overrides: Vec<Option<&RateLimit>> = descriptors.iter().map(|d| d.limit.as_ref()).collect();
        let matched = policy.envoy.limits_for_request(domain, &entries, &overrides);
        let request_hits = if hits_addend == 0 { 1 } else { u64::from(hits_addend) };
        let plans: Vec<Plan<'_>> = descriptors
            .iter()
            .zip(&matched)
            .map(|(descriptor, matched)| plan(matched.as_ref(), descriptor.hits_addend.unwrap_or(request_hits)))
            .collect();
        let quota: Vec<usize> = (0..plans.len()).filter(|&i| plans[i].quota()).collect();
        // A quota-mode descriptor in shadow mode is never over: the quota group always has one
        // within.
        let quota_met = quota.iter().any(|&i| plans[i].shadow());
        let every_quota_blocked =
            !quota.is_empty() && quota.iter().all(|&i| matches!(plans[i], Plan::Blocked { shadow: false, .. }));
        let refused =
            every_quota_blocked || plans.iter().any(|p| matches!(p, Plan::Blocked { shadow: false, quota: false, .. }));
        let asks: Vec<Ask<'_>> = plans
            .iter()
            .filter_map(|p| match p {
                Plan::Checked { check, shadow, quota, .. } => {
                    Some(Ask { check: *check, shadow: *shadow, quota: *quota })
                }
                _ => None,
            })
            .collect();
        let store = self.envoy_store.as_ref().unwrap_or(&self.store);
        let asked = self.counted(asks::decide(store, &asks, refused, quota_met).await)?;
        let admitted = asked.admitted;
        let mut decisions = asked.decisions.into_iter();
        let metrics = self.metrics.descriptors();
        let mut verdicts = Vec::with_capacity(plans.len());
        for plan in plans {
            verdicts.push(match plan {
                Plan::Free => Verdict::Free,
                Plan::Unlimited => Verdict::Unlimited,
                Plan::Blocked { limit, shadow, metric, hits, .. } => {
                    let outcome = if shadow { DescriptorOutcome::Shadow } else { DescriptorOutcome::Over };
                    metrics.record(metric, hits, outcome);
                    Verdict::Limited { limit, over: !shadow, decision: None }
                }
                Plan::Checked { check, limit, shadow, metric, .. } => {
                    let decision = decisions.next().ok_or(StoreError::NoChecks)?;
                    let outcome = match (decision.allowed, admitted) {
                        (false, _) if shadow => DescriptorOutcome::Shadow,
                        (false, _) => DescriptorOutcome::Over,
                        (true, true) => {
                            DescriptorOutcome::Within { remaining: decision.remaining, capacity: decision.limit }
                        }
                        (true, false) => DescriptorOutcome::NotCounted,
                    };
                    metrics.record(metric, check.cost, outcome);
                    // Shadow mode never refuses: over or not, the descriptor is OK.
                    Verdict::Limited { limit, over: !decision.allowed && !shadow, decision: Some(decision) }
                }
            });
        }
        Ok(Verdicts { admitted, verdicts, quota })
    }
}
