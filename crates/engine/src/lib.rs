//! # tollgate-engine
//!
//! One policy engine behind every front end: the RESP and HTTP APIs of `tollgate serve`, the
//! tower/axum middleware and `tollgate proxy`. Front ends parse a request into its
//! characteristics ([`Request`]) and render what the engine decides; the engine does the rest:
//!
//! 1. **mitigations in force**: a key a rule blocked for its `timeout` is answered by the rule's
//!    action at once ([`blocks`]: bounded, sharded, skipped until a first block);
//! 2. **the plan**: the rules that count the request, each with its key and cost (or a 400 for a
//!    bad cost header, or a missing key part under `on_missing = "reject"`);
//! 3. **admission, all or nothing**: one [`Store::reserve`] for every enforced rule, each in its
//!    own scope (the rule's name); `count_status` rules are *reserved* like the others, so
//!    concurrent requests can never push more than `count` through, and refunded by
//!    [`Engine::complete`] when the response's status is not one they count;
//! 4. **the action** of the first rule over its limit: 429, shadow-ban, delay (a GCRA shaper
//!    widened by `max_delay`); dry-run rules are checked on their own and never block;
//! 5. **metrics** ([`metrics`]), and a store error answered by `on_error`, never silently.
//!
//! The rules are swapped atomically by [`Engine::reload`] ([`reload`] watches a file); the state
//! of a rule lives in the store under its name, so an unchanged rule keeps its counts across a
//! reload. Time comes from an injected [`Clock`].

mod blocks;
mod direct;
pub mod metrics;
pub mod reload;

use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use prometheus_client::registry::Registry;
use tollgate_core::{Clock, Decision, Limit, SystemClock};
use tollgate_rules::{Action, Applied, OnError, Rules};
use tollgate_store::{Check, Refund, Store, StoreError};

pub use blocks::DEFAULT_MAX_BLOCKS;
pub use direct::EngineError;
pub use metrics::{Metrics, Outcome, Source};
pub use tollgate_rules::Request;

use metrics::RuleCounters;

/// The rules in force, compiled for the hot path.
#[derive(Debug)]
pub struct Policy {
    /// The rules.
    pub rules: Rules,
    /// The headers the rules read (lowercase): front ends need not copy the others.
    pub header_names: Vec<String>,
    /// Whether any rule looks at the host.
    pub uses_host: bool,
    /// Whether any rule keys on the client address.
    pub uses_client_ip: bool,
    /// Per rule: the limit it is checked under (a delay rule's bucket widened by `max_delay`).
    checked: Vec<Limit>,
    counters: Vec<RuleCounters>,
}

/// What to do with a request.
#[derive(Debug)]
pub enum Admission {
    /// Pass it on (after `delay`), then give its response's status to [`Engine::complete`].
    Proceed(Proceed),
    /// Answer this instead; the request goes no further.
    Answer(Answer),
}

/// A request let through.
#[derive(Debug)]
pub struct Proceed {
    /// How long to hold it first (a delay rule's slot).
    pub delay: Duration,
    /// The tightest rule's name, limit and decision, for the RateLimit fields.
    pub fields: Option<Fields>,
    /// What to settle once the response's status is known.
    pub pending: Pending,
}

/// A rule's state as the RateLimit header fields report it.
#[derive(Debug, Clone)]
pub struct Fields {
    /// The rule's name (the policy name).
    pub policy: String,
    /// Its limit.
    pub limit: Limit,
    /// The decision.
    pub decision: Decision,
}

/// A request answered by the engine.
#[derive(Debug)]
pub enum Answer {
    /// 429, with the rule's fields.
    TooMany(Fields),
    /// A shadow-ban's fake success.
    ShadowBan {
        /// Status code.
        status: u16,
        /// Body.
        body: String,
        /// Content type.
        content_type: String,
    },
    /// 400: the request cannot be counted (a bad cost header, a missing key part).
    BadRequest(String),
    /// 503: the store failed and the rules say not to let requests through then.
    Unavailable(String),
}

/// Reservations of `count_status` rules, settled by [`Engine::complete`]. Dropping it without
/// completing leaves them counted (an under-grant, never an over-grant).
#[derive(Debug, Default)]
pub struct Pending {
    policy: Option<Arc<Policy>>,
    reservations: Vec<Reservation>,
}

#[derive(Debug)]
struct Reservation {
    rule: usize,
    key: Vec<u8>,
    cost: u64,
    at: u64,
    decision: Decision,
}

impl Pending {
    /// Whether there is nothing to settle.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.reservations.is_empty()
    }
}

/// Options of an [`Engine`].
#[derive(Debug)]
pub struct EngineBuilder<S> {
    store: S,
    rules: Rules,
    clock: Arc<dyn Clock>,
    max_blocks: usize,
}

impl<S: Store> EngineBuilder<S> {
    /// The clock (default: the system clock). Tests pass a manual one, as to the store.
    #[must_use]
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// At most this many keys under a mitigation timeout (default 100,000).
    #[must_use]
    pub fn max_blocks(mut self, max: usize) -> Self {
        self.max_blocks = max.max(1);
        self
    }

    /// Builds the engine, its metrics registered in `registry`.
    pub fn build(self, registry: &mut Registry) -> Engine<S> {
        let metrics = Metrics::new(registry);
        let policy = Arc::new(Policy::compile(self.rules, &metrics));
        Engine {
            store: self.store,
            policy: ArcSwap::new(policy),
            clock: self.clock,
            blocks: blocks::Blocks::new(self.max_blocks),
            metrics,
        }
    }
}

/// The policy engine (see the crate docs). Share it behind an `Arc`.
#[derive(Debug)]
pub struct Engine<S> {
    store: S,
    policy: ArcSwap<Policy>,
    clock: Arc<dyn Clock>,
    blocks: blocks::Blocks,
    metrics: Metrics,
}

impl Policy {
    fn compile(rules: Rules, metrics: &Metrics) -> Policy {
        let checked = rules.rules.iter().map(checked_limit).collect();
        let counters = rules.rules.iter().map(|r| metrics.rule(&r.name)).collect();
        let uses_client_ip = rules.rules.iter().any(|r| r.key.contains(&tollgate_rules::Characteristic::ClientIp));
        Policy {
            header_names: rules.header_names(),
            uses_host: rules.uses_host(),
            uses_client_ip,
            rules,
            checked,
            counters,
        }
    }
}

/// The limit a rule is checked under: for `delay`, the bucket widened by `max_delay` (a shaper is
/// GCRA with tolerance `burst*T + max_delay`), so that a request within the delay is admitted
/// and then waits for its slot.
fn checked_limit(rule: &tollgate_rules::Rule) -> Limit {
    match rule.action {
        Action::Delay { max_delay_ns } => {
            let extra = max_delay_ns / rule.limit.emission_interval_ns();
            rule.limit
                .to_builder()
                .burst(rule.limit.burst().saturating_add(extra))
                .build()
                .unwrap_or_else(|_| rule.limit.clone())
        }
        _ => rule.limit.clone(),
    }
}

impl<S: Store> Engine<S> {
    /// An engine applying `rules` with `store`.
    pub fn builder(store: S, rules: Rules) -> EngineBuilder<S> {
        EngineBuilder { store, rules, clock: Arc::new(SystemClock::new()), max_blocks: DEFAULT_MAX_BLOCKS }
    }

    /// The rules in force.
    pub fn policy(&self) -> Arc<Policy> {
        self.policy.load_full()
    }

    /// The store.
    pub fn store(&self) -> &S {
        &self.store
    }

    /// The metrics.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Swaps in new rules atomically. Requests already admitted settle under the rules they were
    /// admitted with; a rule's state (in the store, under its name) is kept.
    pub fn reload(&self, rules: Rules) {
        self.policy.store(Arc::new(Policy::compile(rules, &self.metrics)));
        self.metrics.reloaded(true);
    }

    /// Counts a reload that failed (the rules in force stay).
    pub fn reload_failed(&self) {
        self.metrics.reloaded(false);
    }

    async fn timed<T>(&self, call: impl Future<Output = Result<T, StoreError>>) -> Result<T, StoreError> {
        let started = std::time::Instant::now();
        let result = call.await;
        self.metrics.store_latency.observe(started.elapsed().as_secs_f64());
        if let Err(error) = &result {
            self.metrics.store_error(error);
        }
        result
    }

    /// Decides what to do with `request` (see the crate docs).
    pub async fn admit(&self, request: &Request<'_>) -> Admission {
        let policy = self.policy.load_full();
        let now = self.clock.now_ns();

        // 1. Mitigations in force.
        if self.blocks.any() {
            for applied in policy.rules.mitigating(request) {
                let rule = &policy.rules.rules[applied.rule];
                let Some(until) = self.blocks.until(&rule.name, &applied.key, now) else { continue };
                if rule.action == Action::DryRun {
                    self.dry_run(&policy, applied.rule, &applied.key);
                    continue;
                }
                let wait = until - now;
                let decision = Decision {
                    allowed: false,
                    limit: rule.limit.capacity(),
                    remaining: 0,
                    retry_after_ns: wait,
                    reset_after_ns: wait,
                };
                return Admission::Answer(self.mitigate(&policy, applied.rule, decision));
            }
        }

        // 2. The plan.
        let counted = match policy.rules.counting(request) {
            Ok(counted) => counted,
            Err(error) => {
                tracing::debug!(%error, "request refused by the rules");
                return Admission::Answer(Answer::BadRequest(error.0));
            }
        };
        if counted.is_empty() {
            return Admission::Proceed(Proceed { delay: Duration::ZERO, fields: None, pending: Pending::default() });
        }

        // 3. Dry-run rules on their own (never blocking); the others all or nothing.
        let mut pending = Pending { policy: Some(policy.clone()), reservations: Vec::new() };
        let (dry, enforced): (Vec<Applied>, Vec<Applied>) =
            counted.into_iter().partition(|a| policy.rules.rules[a.rule].action == Action::DryRun);
        for applied in dry {
            self.check_dry_run(&policy, applied, &mut pending).await;
        }
        if enforced.is_empty() {
            return Admission::Proceed(Proceed { delay: Duration::ZERO, fields: None, pending });
        }
        let checks: Vec<Check<'_>> = enforced
            .iter()
            .map(|a| Check::new(&a.key, &policy.checked[a.rule], a.cost).scoped(&policy.rules.rules[a.rule].name))
            .collect();
        let reserved = match self.timed(self.store.reserve(&checks)).await {
            Ok(reserved) => reserved,
            Err(error) => return self.store_failed(&policy, &enforced, &error, pending),
        };

        // 4. The first rule over its limit acts; otherwise everything is admitted.
        if let Some(i) = reserved.decisions.iter().position(|d| !d.allowed) {
            let applied = &enforced[i];
            let decision = reserved.decisions[i];
            let rule = &policy.rules.rules[applied.rule];
            if rule.timeout_ns > 0 {
                let until = now.saturating_add(rule.timeout_ns.max(decision.retry_after_ns));
                let dropped = self.blocks.block(&rule.name, &applied.key, until, now);
                self.metrics.blocks_dropped.inc_by(dropped);
                self.metrics.blocked.set(i64::try_from(self.blocks.len()).unwrap_or(i64::MAX));
            }
            // Reservations of dry-run rules made above are settled now: the request goes no further.
            self.settle(pending, None).await;
            return Admission::Answer(self.mitigate(&policy, applied.rule, decision));
        }
        let mut delay = 0;
        for (i, (applied, decision)) in enforced.iter().zip(&reserved.decisions).enumerate() {
            let rule = &policy.rules.rules[applied.rule];
            let wait = match rule.action {
                Action::Delay { .. } => decision.reset_after_ns.saturating_sub(rule.limit.tolerance_ns()),
                _ => 0,
            };
            self.metrics
                .count(&policy.counters[applied.rule], if wait > 0 { Outcome::Delayed } else { Outcome::Allowed });
            delay = delay.max(wait);
            if rule.count_status.is_some() {
                pending.reservations.push(Reservation {
                    rule: applied.rule,
                    key: applied.key.clone(),
                    cost: applied.cost,
                    at: reserved.instant(i),
                    decision: *decision,
                });
            }
        }
        let fields = enforced.iter().zip(&reserved.decisions).min_by_key(|(_, d)| d.remaining).map(|(a, d)| Fields {
            policy: policy.rules.rules[a.rule].name.clone(),
            limit: policy.rules.rules[a.rule].limit.clone(),
            decision: *d,
        });
        Admission::Proceed(Proceed { delay: Duration::from_nanos(delay), fields, pending })
    }

    /// Settles a request's reservations once its response's status is known: each `count_status`
    /// rule keeps what it reserved if it counts `status`, and gives it back otherwise.
    pub async fn complete(&self, pending: Pending, status: u16) {
        self.settle(pending, Some(status)).await;
    }

    /// Keeps (`status` counted) or refunds every reservation; `None` refunds them all.
    async fn settle(&self, pending: Pending, status: Option<u16>) {
        let Some(policy) = pending.policy else { return };
        let mut refunds = Vec::new();
        for reservation in &pending.reservations {
            let rule = &policy.rules.rules[reservation.rule];
            if status.is_some_and(|s| rule.counts_status(s)) {
                self.metrics.count(&policy.counters[reservation.rule], Outcome::Counted);
            } else {
                self.metrics.count(&policy.counters[reservation.rule], Outcome::Refunded);
                refunds.push(Refund {
                    check: Check::new(&reservation.key, &policy.checked[reservation.rule], reservation.cost)
                        .scoped(&rule.name),
                    at: reservation.at,
                    decision: reservation.decision,
                });
            }
        }
        if !refunds.is_empty()
            && let Err(error) = self.timed(self.store.refund(&refunds)).await
        {
            tracing::warn!(%error, "refund failed: the reservations stay counted");
        }
    }

    async fn check_dry_run(&self, policy: &Arc<Policy>, applied: Applied, pending: &mut Pending) {
        let rule = &policy.rules.rules[applied.rule];
        let check = Check::new(&applied.key, &policy.checked[applied.rule], applied.cost).scoped(&rule.name);
        match self.timed(self.store.reserve(&[check])).await {
            Ok(reserved) if !reserved.decisions[0].allowed => self.dry_run(policy, applied.rule, &applied.key),
            Ok(reserved) => {
                self.metrics.count(&policy.counters[applied.rule], Outcome::Allowed);
                if rule.count_status.is_some() {
                    pending.reservations.push(Reservation {
                        rule: applied.rule,
                        key: applied.key,
                        cost: applied.cost,
                        at: reserved.at,
                        decision: reserved.decisions[0],
                    });
                }
            }
            Err(error) => {
                self.metrics.count(&policy.counters[applied.rule], Outcome::Error);
                tracing::warn!(rule = %rule.name, %error, "store error; the dry-run rule is not counted");
            }
        }
    }

    fn dry_run(&self, policy: &Policy, rule: usize, key: &[u8]) {
        self.metrics.count(&policy.counters[rule], Outcome::DryRun);
        tracing::warn!(
            rule = %policy.rules.rules[rule].name,
            key = %String::from_utf8_lossy(key),
            "dry-run: this request is over the limit and would be mitigated"
        );
    }

    fn mitigate(&self, policy: &Policy, rule: usize, decision: Decision) -> Answer {
        let r = &policy.rules.rules[rule];
        match &r.action {
            Action::ShadowBan { status, body, content_type } => {
                self.metrics.count(&policy.counters[rule], Outcome::ShadowBanned);
                Answer::ShadowBan { status: *status, body: body.clone(), content_type: content_type.clone() }
            }
            _ => {
                self.metrics.count(&policy.counters[rule], Outcome::Rejected);
                Answer::TooMany(Fields { policy: r.name.clone(), limit: r.limit.clone(), decision })
            }
        }
    }

    /// The store failed for the enforced rules: `on_error` decides, never silently.
    fn store_failed(&self, policy: &Policy, enforced: &[Applied], error: &StoreError, pending: Pending) -> Admission {
        for applied in enforced {
            self.metrics.count(&policy.counters[applied.rule], Outcome::Error);
        }
        match policy.rules.on_error {
            OnError::Reject => {
                tracing::warn!(%error, "store error: request answered 503 (on_error = \"reject\")");
                Admission::Answer(Answer::Unavailable(format!("the rate limiter's store failed: {error}")))
            }
            OnError::Allow => {
                tracing::warn!(%error, "store error: request let through (on_error = \"allow\")");
                Admission::Proceed(Proceed { delay: Duration::ZERO, fields: None, pending })
            }
        }
    }
}
