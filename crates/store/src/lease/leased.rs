//! [`Leased`]: a store whose hot keys are decided from leased slices (see the module docs of
//! `lease`), every other decision passed to the store it wraps.

use std::sync::Arc;

use tollgate_core::{Clock, Limit};

use super::book::{Book, Order, Spend};
use super::{LeaseMode, LeaseOptions, LeaseStats, Lessor};
use crate::{Check, Refund, Reserved, Store, StoreError};

/// `S` with leases for its hot keys. Cheap to clone: clones share the leases.
#[derive(Debug, Clone)]
pub struct Leased<S> {
    inner: S,
    book: Arc<Book>,
    clock: Arc<dyn Clock>,
}

impl<S> Leased<S> {
    /// Leases `inner`'s hot keys by `options`, on the node's `clock` (lifetimes and rates).
    pub fn new(inner: S, options: LeaseOptions, clock: Arc<dyn Clock>) -> Self {
        Leased { inner, book: Arc::new(Book::new(options)), clock }
    }

    /// The wrapped store.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    /// The leases' counters.
    #[must_use]
    pub fn stats(&self) -> LeaseStats {
        self.book.stats()
    }

    /// The mode.
    #[must_use]
    pub fn mode(&self) -> LeaseMode {
        self.book.options().mode
    }
}

impl<S: Store + Lessor + Clone + 'static> Leased<S> {
    /// Sends `order` in a task of its own; without a runtime it is dropped (abandoned).
    fn send(&self, order: Option<Order>) {
        let Some(order) = order else { return };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        let (inner, book, clock) = (self.inner.clone(), self.book.clone(), self.clock.clone());
        let options = book.options();
        let (lessee, lifetime) = (options.lessee, options.lifetime);
        runtime.spawn(async move {
            let result = inner.lease(order.check(), order.want, lessee, lifetime).await;
            book.granted(order, result, clock.now_ns());
        });
    }

    /// One check of positive cost: from its slice when it has one, else exactly. While its slice
    /// is spent and a refill is in flight, it waits for the refill (one round trip, as an exact
    /// call would take) for at most a lifetime from its first wait.
    async fn reserve_one(&self, check: &Check<'_>) -> Result<Reserved, StoreError> {
        // Read only once the request waits: a clock read less for every local decision.
        let mut deadline = None;
        let mut waited = false;
        loop {
            match self.book.spend(check, self.clock.now_ns(), waited) {
                Spend::Local { decision, at, order } => {
                    self.send(order);
                    return Ok(Reserved::at(vec![decision], at));
                }
                Spend::Wait { order, refill } => {
                    self.send(order);
                    let now = tokio::time::Instant::now();
                    let until = *deadline.get_or_insert_with(|| now + self.book.options().lifetime);
                    if now >= until {
                        break;
                    }
                    let _ = tokio::time::timeout_at(until, refill.wait()).await;
                    waited = true;
                }
                Spend::Exact { order } => {
                    self.send(order);
                    break;
                }
            }
        }
        // It waited on a lease call that failed: the backend is failing, and the policy answers
        // (a second wait on it would double this request's latency).
        if waited
            && self.book.failing(check, self.clock.now_ns())
            && let Some(answer) = self.inner.fall_back(std::slice::from_ref(check))
        {
            return answer;
        }
        self.book.count_exact();
        self.send(self.book.observe_exact(check, self.clock.now_ns()));
        // Boxed, as every call to the store it wraps here: that future (a Redis call through the
        // failure policy) is large, and inline it would be moved with every leased decision,
        // which never builds it.
        Box::pin(self.inner.reserve(std::slice::from_ref(check))).await
    }
}

impl<S: Store + Lessor + Clone + 'static> Store for Leased<S> {
    async fn reserve(&self, checks: &[Check<'_>]) -> Result<Reserved, StoreError> {
        if self.book.options().mode == LeaseMode::Off {
            self.book.count_exact();
            return Box::pin(self.inner.reserve(checks)).await;
        }
        if let [check] = checks
            && check.cost > 0
            && check.cost <= check.limit.capacity()
            && !check.hold
        {
            return self.reserve_one(check).await;
        }
        // Peeks, requests under several limits and checks asking for their holds are decided
        // exactly (see the module docs); only the others make a key hot.
        self.book.count_exact();
        let now = self.clock.now_ns();
        for check in checks.iter().filter(|c| c.cost <= c.limit.capacity() && !c.hold) {
            self.send(self.book.observe_exact(check, now));
        }
        Box::pin(self.inner.reserve(checks)).await
    }

    /// On the store itself: a lease holds units taken already, a charge adds to what is taken.
    async fn charge(&self, checks: &[Check<'_>]) -> Result<(), StoreError> {
        Box::pin(self.inner.charge(checks)).await
    }

    async fn refund(&self, refunds: &[Refund<'_>]) -> Result<(), StoreError> {
        let now = self.clock.now_ns();
        let rest: Vec<Refund<'_>> = refunds
            .iter()
            .filter(|r| !(r.decision.allowed && r.check.cost > 0 && self.book.credit(&r.check, r.at, now)))
            .copied()
            .collect();
        if rest.is_empty() {
            return Ok(());
        }
        let result = self.inner.refund(&rest).await;
        // Units given back to the store: the state of a reply before is no longer an upper bound.
        for refund in &rest {
            self.book.freed(&refund.check);
        }
        result
    }

    /// Drops the key's lease at once, and once the store is reset ends any denial cached
    /// meanwhile: a lease call answered while the reset was on its way (a request of the key
    /// started it) carries the state before the reset, and a call sent before then cannot start
    /// one.
    async fn reset(&self, scope: &str, key: &[u8], limit: &Limit) -> Result<(), StoreError> {
        let check = Check { scope, key, limit, cost: 0, hold: false, reporting: false };
        self.book.forget(&check);
        let result = self.inner.reset(scope, key, limit).await;
        self.book.freed(&check);
        result
    }

    /// On the inner store; a lease of the old state is not carried (it lapses within its
    /// lifetime, its unused part counted as used: an under-grant).
    async fn carry(&self, scope: &str, key: &[u8], from: &Limit, to: &Limit) -> Result<u64, StoreError> {
        self.inner.carry(scope, key, from, to).await
    }

    async fn hold(&self, scope: &str, key: &[u8], hold_ns: u64) -> Result<(), StoreError> {
        self.inner.hold(scope, key, hold_ns).await
    }
}
