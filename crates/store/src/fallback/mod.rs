//! [`Fallback`]: what a [`Remote`] store (Redis) answers when it fails or is slow, so that trouble
//! with the backend costs availability or under-grants, never over-grants on one node.
//!
//! - **Failure policy**: `Open` admits, `Closed` denies, `Local` decides in this process.
//! - **Local continues from what the node last saw.** Every reply carries each key's snapshot;
//!   a local decision rebuilds the key's state from the latest one, charges it with what this node
//!   admitted locally since (its debt) and with every call still in flight (which the backend may
//!   yet admit), and decides on that. Not from a full bucket.
//! - **Debts are paid.** What the node admitted locally is charged to the backend with the next
//!   call for the key, or by a background flush once the backend answers again; the charge may put
//!   the key in debt there, so the fleet's later decisions account for it. A reply that arrives
//!   after its timeout is never used: the call was decided locally, and if the backend admitted it
//!   too, the key is charged twice (an under-grant of that one call).
//! - **A circuit breaker per server** ([`Breakers`]): after a few consecutive failures of one
//!   server (a fault domain: [`Remote::domain`]), calls for the keys it holds stop waiting on it and
//!   are answered by the policy at once, while the keys of every other server go on as usual; one
//!   background task probes that server and closes its breaker when it answers, or forgets it when
//!   the topology no longer has it (a failover moved its keys). A dead or frozen server costs no
//!   timeout per call. A request whose keys live on several servers is answered by the policy
//!   whole when any of them is failing; when one fails during the request, what the others
//!   answered stands and the policy answers the rest, all or nothing (see `across`).
//!
//! **The bound.** One node never admits more than the limit across a slow, paused or failing
//! backend: its local decisions start from the backend's state as of its latest reply (every
//! node's admissions up to then) plus everything it sent since. With `N` nodes, each decides on its
//! own during an outage of length `D`: the fleet admits at most `N × (capacity + D / T)` for a
//! bucket (`N × count` per window for the window family) where the limit allows `capacity + D / T`,
//! and once the backend is back every node's debt is charged, so the key is denied until the
//! excess is paid back. `Open` has no bound; `Closed` never over-grants.

#[macro_use]
mod timer;
mod across;
mod breaker;
mod ledger;
mod lessor;
mod merge;
mod pending;
mod store;

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

pub use breaker::{Breaker, BreakerState, Breakers, DEFAULT_PROBE_EVERY, DEFAULT_THRESHOLD};
use ledger::{Debt, Ledger};
pub use timer::CallTimer;
use tollgate_core::{Clock, Decision, Limit, SystemClock};

use crate::memory::{DEFAULT_MAX_KEYS, DEFAULT_MAX_MEMORY};
use crate::remote::{Charge, Domain, Origin, Remote, Reply};
use crate::{Check, Reserved, StoreError};

tollgate_core::words! {
    /// What to answer while the backend fails (`--on-store-error`).
    #[derive(Default)]
    pub enum FailurePolicy: "failure policy" {
        /// Admit every request (availability first): `remaining` is reported as the capacity left
        /// after the cost, `retry_after` and `reset_after` as 0.
        Open = "open",
        /// Deny every request (protection first): `retry_after` is one emission interval.
        Closed = "closed",
        /// Decide in this process, from the state last seen and what was admitted since (the
        /// default: a per-process limit stays in force).
        #[default]
        Local = "local",
    }
}

/// Settings of a [`Fallback`].
#[derive(Debug)]
pub struct FallbackOptions {
    /// The circuit breakers' settings, one breaker per server (default: each opens after 3
    /// consecutive failures of its server, and then probes it every 100 ms).
    pub breaker: Breaker,
    /// The node's clock, for local decisions (default: the system clock). Instants are moved to
    /// the backend's clock by the offset seen in its replies.
    pub clock: Arc<dyn Clock>,
    /// Keys the ledger follows (default 1,000,000) and the bytes it may hold (default 512 MiB).
    pub max_keys: usize,
    /// See `max_keys`.
    pub max_memory: usize,
    /// Told the duration of every call (default: none).
    pub timer: Option<CallTimer>,
}

impl Default for FallbackOptions {
    fn default() -> Self {
        FallbackOptions {
            breaker: Breaker::default(),
            clock: Arc::new(SystemClock::new()),
            max_keys: DEFAULT_MAX_KEYS,
            max_memory: DEFAULT_MAX_MEMORY,
            timer: None,
        }
    }
}

/// Counters of a [`Fallback`], for metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FallbackStats {
    /// Calls answered by the failure policy (backend failed, or breaker open).
    pub fallbacks: u64,
    /// Calls to the backend that failed or timed out.
    pub backend_errors: u64,
    /// Whether any server's breaker is open now.
    pub breaker_open: bool,
    /// How many times a breaker opened (all servers).
    pub breaker_opened: u64,
    /// Keys whose local admissions the backend has not recorded yet.
    pub debts: usize,
    /// Charges the backend confirmed.
    pub charges_paid: u64,
    /// Ledger entries dropped while still needed (each can let this node over-grant).
    pub ledger_evictions: u64,
}

/// A store that answers by `policy` whenever the remote `R` fails (see the module docs).
/// Cheap to clone: clones share everything.
pub struct Fallback<R> {
    shared: Arc<Shared<R>>,
}

impl<R> Clone for Fallback<R> {
    fn clone(&self) -> Self {
        Fallback { shared: self.shared.clone() }
    }
}

struct Shared<R> {
    remote: R,
    timer: Option<CallTimer>,
    policy: FailurePolicy,
    breakers: Breakers,
    ledger: Ledger,
    clock: Arc<dyn Clock>,
    /// The backend's now minus the node's, from the latest reply.
    offset_ns: AtomicI64,
    fallbacks: AtomicU64,
    backend_errors: AtomicU64,
    charges_paid: AtomicU64,
    flush: Arc<tokio::sync::Notify>,
    flusher: AtomicBool,
}

impl<R: std::fmt::Debug> std::fmt::Debug for Fallback<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fallback")
            .field("remote", &self.shared.remote)
            .field("policy", &self.shared.policy)
            .field("breakers", &self.shared.breakers.states())
            .finish_non_exhaustive()
    }
}

impl<R: Remote> Fallback<R> {
    /// Wraps `remote` with default options.
    pub fn new(remote: R, policy: FailurePolicy) -> Self {
        Fallback::with_options(remote, policy, FallbackOptions::default())
    }

    /// Wraps `remote`.
    pub fn with_options(remote: R, policy: FailurePolicy, options: FallbackOptions) -> Self {
        let FallbackOptions { breaker, clock, max_keys, max_memory, timer } = options;
        Fallback {
            shared: Arc::new(Shared {
                remote,
                policy,
                breakers: Breakers::new(&breaker),
                ledger: Ledger::new(max_keys, max_memory),
                clock,
                offset_ns: AtomicI64::new(0),
                fallbacks: AtomicU64::new(0),
                backend_errors: AtomicU64::new(0),
                charges_paid: AtomicU64::new(0),
                flush: Arc::new(tokio::sync::Notify::new()),
                flusher: AtomicBool::new(false),
                timer,
            }),
        }
    }

    /// The wrapped store.
    pub fn inner(&self) -> &R {
        &self.shared.remote
    }

    /// The failure policy.
    pub fn policy(&self) -> FailurePolicy {
        self.shared.policy
    }

    /// The circuit breakers, one per server.
    pub fn breakers(&self) -> &Breakers {
        &self.shared.breakers
    }

    /// Calls answered by the failure policy so far.
    pub fn fallbacks(&self) -> u64 {
        self.shared.fallbacks.load(Ordering::Relaxed)
    }

    /// Counters for metrics.
    pub fn stats(&self) -> FallbackStats {
        let sh = &self.shared;
        let (debts, ledger_evictions) = sh.ledger.counts();
        FallbackStats {
            fallbacks: sh.fallbacks.load(Ordering::Relaxed),
            backend_errors: sh.backend_errors.load(Ordering::Relaxed),
            breaker_open: sh.breakers.any_open(),
            breaker_opened: sh.breakers.times_opened(),
            debts,
            charges_paid: sh.charges_paid.load(Ordering::Relaxed),
            ledger_evictions,
        }
    }
}

/// The charges of `debts`, dated relative to `now`; each key's last charge carries what the node
/// knows of the key.
fn charges_of(debts: &[Debt], now: u64) -> Vec<Charge<'_>> {
    debts
        .iter()
        .flat_map(|d| {
            let last = d.charges.len().saturating_sub(1);
            d.charges.iter().enumerate().map(move |(i, c)| Charge {
                check: Check {
                    scope: &d.scope,
                    key: &d.key,
                    limit: &d.limit,
                    cost: c.cost,
                    hold: false,
                    reporting: false,
                },
                age_ns: now.saturating_sub(c.at),
                origin: Some(Origin { node: d.origin, total: c.total }),
                known_remaining: if i == last { d.known_remaining } else { None },
                seen: if i == last { d.seen } else { None },
                view: false,
            })
        })
        .collect()
}

/// Counts `checks` in flight until dropped (also when the caller gives up on the call).
struct InFlight<'a> {
    ledger: &'a Ledger,
    checks: &'a [Check<'a>],
    now: u64,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.ledger.end(self.checks, self.now);
    }
}

impl InFlight<'_> {
    /// The call was answered with `reply` (to these very checks): no longer in flight, its
    /// snapshots kept, in one look at each key (see [`Ledger::answered`]).
    fn answered(self, reply: &Reply, now: u64, epoch: u64) {
        let this = std::mem::ManuallyDrop::new(self);
        this.ledger.answered(this.checks, reply, now, epoch);
    }
}

impl<R: Remote> Shared<R> {
    /// Now on the backend's clock, as estimated from the node's.
    fn now(&self) -> u64 {
        let local = i128::from(self.clock.now_ns());
        u64::try_from((local + i128::from(self.offset_ns.load(Ordering::Relaxed))).max(0)).unwrap_or(u64::MAX)
    }

    /// The fault domains of `checks` (each once), with their breakers.
    fn breakers_of(&self, checks: &[Check<'_>]) -> Vec<(Domain, Arc<Breaker>)> {
        let mut out: Vec<(Domain, Arc<Breaker>)> = Vec::with_capacity(1);
        for check in checks {
            let domain = self.remote.domain(check);
            if !out.iter().any(|(d, _)| *d == domain) {
                let breaker = self.breakers.get(&domain);
                out.push((domain, breaker));
            }
        }
        out
    }

    /// How many calls failed so far (a call sent after a failure may find a key lost).
    fn epoch(&self) -> u64 {
        self.backend_errors.load(Ordering::Acquire)
    }

    /// The backend answered `checks` (sent with `debts`' charges when `epoch` calls had failed),
    /// from the servers of `breakers`; `in_flight` counts these very checks in flight (ended
    /// here, in the same look at each key as its snapshot is kept).
    fn answered(
        &self,
        checks: &[Check<'_>],
        debts: &[Debt],
        reply: &Reply,
        breakers: &[(Domain, Arc<Breaker>)],
        epoch: u64,
        in_flight: Option<InFlight<'_>>,
    ) {
        for (_, breaker) in breakers {
            breaker.success();
        }
        let offset = i128::from(reply.now_ns) - i128::from(self.clock.now_ns());
        self.offset_ns.store(i64::try_from(offset).unwrap_or(0), Ordering::Relaxed);
        if self.policy == FailurePolicy::Local {
            let now = self.now();
            // Record before settling: in between, a local decision counts the charges twice
            // (stricter), never zero times.
            match in_flight {
                Some(in_flight) => in_flight.answered(reply, now, epoch),
                None => self.ledger.record(checks, reply, now, epoch),
            }
            self.paid(debts, now);
        }
    }

    /// A reply confirmed `debts`' charges.
    fn paid<'d>(&self, debts: impl IntoIterator<Item = &'d Debt> + Clone, now: u64) {
        self.ledger.settle(debts.clone(), now);
        let paid: usize = debts.into_iter().map(|d| d.charges.len()).sum();
        self.charges_paid.fetch_add(paid as u64, Ordering::Relaxed);
    }

    /// Answers `checks` by the policy.
    fn fall_back(self: &Arc<Self>, checks: &[Check<'_>]) -> Result<Reserved, StoreError> {
        self.fallbacks.fetch_add(1, Ordering::Relaxed);
        let at = self.now();
        Ok(Reserved::at(self.by_policy(checks, at)?, at))
    }

    /// `checks` decided by the policy at `at`, all or nothing (`local`'s admissions become debt).
    fn by_policy(self: &Arc<Self>, checks: &[Check<'_>], at: u64) -> Result<Vec<Decision>, StoreError> {
        Ok(match self.policy {
            FailurePolicy::Open => checks.iter().map(|c| open(c.limit, c.cost)).collect(),
            FailurePolicy::Closed => checks.iter().map(|c| closed(c.limit)).collect(),
            FailurePolicy::Local => {
                let decisions = self.ledger.decide(checks, at)?;
                if decisions.iter().all(|d| d.allowed) && checks.iter().any(|c| c.cost > 0) {
                    self.start_flusher();
                    self.flush.notify_one();
                }
                decisions
            }
        })
    }

    /// A call to the servers of `breakers` failed: count it against each, and start probing the
    /// ones whose breaker that opened.
    fn failed(self: &Arc<Self>, error: &StoreError, breakers: &[(Domain, Arc<Breaker>)]) {
        self.backend_errors.fetch_add(1, Ordering::Relaxed);
        for (domain, breaker) in breakers {
            if breaker.failure() {
                tracing::warn!(%error, node = %domain, "server unavailable: its circuit breaker is open, the failure policy answers its keys");
                self.start_probe(domain.clone(), breaker.clone());
            }
        }
    }

    fn start_probe(self: &Arc<Self>, domain: Domain, breaker: Arc<Breaker>) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            // No runtime to probe from: let the next call try the server.
            breaker.close();
            return;
        };
        let weak: Weak<Self> = Arc::downgrade(self);
        let every = self.breakers.probe_every();
        runtime.spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                let Some(shared) = weak.upgrade() else { return };
                match shared.remote.probe_domain(&domain).await {
                    Ok(true) => {
                        breaker.close();
                        tracing::info!(node = %domain, "server reachable again: its circuit breaker closed");
                    }
                    Ok(false) => {
                        breaker.close();
                        shared.breakers.forget(&domain);
                        tracing::info!(node = %domain, "server no longer in the topology (its keys moved): breaker dropped");
                    }
                    Err(_) => continue,
                }
                shared.flush.notify_one();
                return;
            }
        });
    }

    /// Starts the task that charges debts to the backend once it answers (once per store).
    fn start_flusher(self: &Arc<Self>) {
        if self.flusher.swap(true, Ordering::AcqRel) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            self.flusher.store(false, Ordering::Release);
            return;
        };
        let weak: Weak<Self> = Arc::downgrade(self);
        let notify = self.flush.clone();
        runtime.spawn(async move {
            loop {
                let _ = tokio::time::timeout(Duration::from_secs(1), notify.notified()).await;
                let Some(shared) = weak.upgrade() else { return };
                shared.flush_debts().await;
            }
        });
    }

    /// Sends every debt whose server's breaker is closed, one key per call (with a peek of the
    /// key, to learn its state).
    async fn flush_debts(self: &Arc<Self>) {
        for debt in self.ledger.debts(self.now()) {
            let now = self.now();
            let epoch = self.epoch();
            let peek = Check {
                scope: &debt.scope,
                key: &debt.key,
                limit: &debt.limit,
                cost: 0,
                hold: false,
                reporting: false,
            };
            let breakers = self.breakers_of(&[peek]);
            if breakers.iter().any(|(_, b)| b.is_open()) {
                continue;
            }
            // Taken again now: what the node knows is dated at the call, not at the flush's start.
            let Some(debt) = self.ledger.outgoing(&[peek], now, 0).0.pop() else { continue };
            let sent = [debt];
            let charges = charges_of(&sent, now);
            let peek = Check {
                scope: &sent[0].scope,
                key: &sent[0].key,
                limit: &sent[0].limit,
                cost: 0,
                hold: false,
                reporting: false,
            };
            match self.remote.decide(&[peek], &charges).await {
                Ok(reply) => self.answered(&[peek], &sent, &reply, &breakers, epoch, None),
                Err(error) if error.is_backend() => self.failed(&error, &breakers),
                Err(error) => {
                    // The key holds something tollgate cannot charge (another program's value):
                    // there is nothing to pay into; drop the debt rather than retry forever.
                    tracing::warn!(%error, "cannot charge a key's local admissions to the store; dropped");
                    self.ledger.settle(&sent, now);
                }
            }
        }
    }
}

fn open(limit: &Limit, cost: u64) -> Decision {
    let capacity = limit.capacity();
    Decision {
        allowed: true,
        limit: capacity,
        remaining: capacity.saturating_sub(cost),
        retry_after_ns: 0,
        reset_after_ns: 0,
    }
}

fn closed(limit: &Limit) -> Decision {
    Decision {
        allowed: false,
        limit: limit.capacity(),
        remaining: 0,
        retry_after_ns: limit.emission_interval_ns(),
        reset_after_ns: 0,
    }
}
