//! The policy in force as the engine holds it ([`Policy`]): the rules, compiled once per load or
//! reload (each rule's checked limit, metrics series, rate scope, carries and holds' reading),
//! and Envoy's configuration (envoyproxy/ratelimit's YAML: its descriptor trees, each limit
//! built), lent to every request ([`Current`]). Both sources are one value, swapped as one: a
//! request is decided under one version of both. It holds none of [`Engine`](crate::Engine)'s
//! methods: the engine swaps policies ([`Engine::reload`](crate::Engine::reload) and
//! [`Engine::reload_envoy`](crate::Engine::reload_envoy), in `reload`) and decides requests
//! under one.

use std::sync::Arc;

use tollgate_core::Limit;
use tollgate_rules::{Action, Rules};

use crate::metrics::{Metrics, RuleCounters};
use crate::{carry, settle, shared};

/// The rules in force, as [`Engine::current`](crate::Engine::current) lends them.
pub type Current = arc_swap::Guard<Arc<Policy>>;

/// The policy in force, compiled for the hot path.
#[derive(Debug)]
pub struct Policy {
    /// The rules.
    pub rules: Rules,
    /// Envoy's configuration: the limits of its descriptors, by domain (empty without one).
    pub envoy: Arc<tollgate_envoy::Config>,
    /// The headers the rules read (lowercase): front ends need not copy the others.
    pub header_names: Vec<String>,
    /// Whether any rule looks at the host.
    pub uses_host: bool,
    /// Whether any rule keys on a TLS fingerprint (`ja3`, `ja4`): front ends need not look for
    /// one otherwise.
    pub uses_fingerprints: bool,
    /// Whether any rule keys on the client address (or its AS number).
    pub uses_client_ip: bool,
    /// Per rule: the limit it is checked under (a delay rule's shaper, as wide as `max_delay`).
    pub(crate) checked: Vec<Limit>,
    pub(crate) counters: Vec<RuleCounters>,
    /// Per rule: its name, scoping its measured rates.
    pub(crate) names: Vec<Arc<str>>,
    /// Per rule: whether it is plain, rejecting when over, counting every request, holding no
    /// timeout: a request it alone counts is decided by one store check (see `admit`).
    pub(crate) plain: Vec<bool>,
    /// Whether any rule is measured (none: requests skip the rates entirely).
    pub(crate) measures: bool,
    /// The engine's `count_status` reservations not settled yet (every policy of an engine
    /// shares it: requests admitted under one are settled under it, after a reload too).
    pub(crate) in_flight: Arc<settle::InFlight>,
    /// Per rule, the limits its keys' use is carried from after a reload changed its algorithm.
    pub(crate) carries: carry::Carries,
    /// Per rule, how its holds are read from the store (see `shared`).
    pub(crate) shares: shared::Shares,
}

impl Policy {
    /// `rules` compiled, beside `envoy`; `previous`: the policy they replace, and when.
    pub(crate) fn compile(
        rules: Rules,
        envoy: Arc<tollgate_envoy::Config>,
        metrics: &Metrics,
        in_flight: &Arc<settle::InFlight>,
        previous: Option<(&Policy, u64)>,
    ) -> Policy {
        let checked: Vec<Limit> = rules.rules.iter().map(checked_limit).collect();
        let carries = match previous {
            Some((previous, now)) => carry::Carries::after(&rules, &checked, previous, now),
            None => carry::Carries::none(rules.rules.len()),
        };
        let counters = rules.rules.iter().map(|r| metrics.rule(&r.name)).collect();
        // The AS number is the client address's.
        let uses_client_ip = rules.rules.iter().any(|r| {
            r.key
                .iter()
                .any(|k| matches!(k, tollgate_rules::Characteristic::ClientIp | tollgate_rules::Characteristic::Asn))
        });
        let names = names(&rules);
        let plain =
            rules.rules.iter().map(|r| r.action == Action::Reject && !r.settles_after() && r.timeout_ns == 0).collect();
        let measures = rules.rules.iter().any(|r| r.measured);
        let uses_fingerprints = rules.rules.iter().any(|r| {
            r.key.iter().any(|k| matches!(k, tollgate_rules::Characteristic::Ja3 | tollgate_rules::Characteristic::Ja4))
        });
        let shares = shared::Shares::of(&rules);
        Policy {
            measures,
            uses_fingerprints,
            header_names: rules.header_names(),
            uses_host: rules.uses_host(),
            uses_client_ip,
            rules,
            envoy,
            checked,
            counters,
            names,
            plain,
            in_flight: in_flight.clone(),
            carries,
            shares,
        }
    }
}

/// The limit a rule is checked under: for `delay`, its shaper as wide as `max_delay` (see
/// [`Rule::shaper`](tollgate_rules::Rule::shaper)), so that a request within the delay is
/// admitted and then waits for its slot. A rules file refuses a `max_delay` whose shaper cannot
/// be built; rules built otherwise get the widest that can (never none at all).
fn checked_limit(rule: &tollgate_rules::Rule) -> Limit {
    match rule.action {
        Action::Delay { max_delay_ns } => rule
            .shaper(max_delay_ns)
            .or_else(|| rule.shaper(tollgate_core::MAX_PERIOD_NS.saturating_sub(rule.limit.tolerance_ns())))
            .unwrap_or_else(|| rule.limit.clone()),
        _ => rule.limit.clone(),
    }
}

/// Keeps `Arc` in use for the names the rates are scoped by.
fn names(rules: &tollgate_rules::Rules) -> Vec<Arc<str>> {
    rules.rules.iter().map(|r| Arc::from(r.name.as_str())).collect()
}
