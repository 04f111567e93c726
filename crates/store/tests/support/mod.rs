//! What the failure-policy tests share: a node (a `Fallback`) over a memory store whose calls fail
//! on demand, and the forwarding `Store` of the tests' own remotes.

#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use tollgate_store::fallback::FallbackOptions;
use tollgate_store::testkit::faults::Faulty;
use tollgate_store::{Breaker, FailurePolicy, Fallback, Limit, ManualClock, MemoryStore, Store};

pub(crate) const SEC: u64 = 1_000_000_000;
pub(crate) const T0: u64 = 1_700_000_000 * SEC;

pub(crate) struct Node {
    pub(crate) store: Fallback<Arc<Faulty<MemoryStore>>>,
}

pub(crate) fn backend(clock: &Arc<ManualClock>) -> Arc<Faulty<MemoryStore>> {
    Arc::new(Faulty::new(MemoryStore::builder().clock(clock.clone()).build()))
}

/// A node whose breaker opens after 3 failures and probes every 100 ms.
pub(crate) fn node(remote: &Arc<Faulty<MemoryStore>>, clock: &Arc<ManualClock>, policy: FailurePolicy) -> Node {
    with_breaker(remote, clock, policy, Breaker::new(3, Duration::from_millis(100)))
}

/// A `local` node whose breaker never opens: every call tries the backend (the faults decide).
pub(crate) fn patient_node(remote: &Arc<Faulty<MemoryStore>>, clock: &Arc<ManualClock>) -> Node {
    with_breaker(remote, clock, FailurePolicy::Local, Breaker::new(u32::MAX, Duration::from_millis(100)))
}

fn with_breaker(
    remote: &Arc<Faulty<MemoryStore>>,
    clock: &Arc<ManualClock>,
    policy: FailurePolicy,
    breaker: Breaker,
) -> Node {
    let options = FallbackOptions { clock: clock.clone(), breaker, ..FallbackOptions::default() };
    Node { store: Fallback::with_options(remote.clone(), policy, options) }
}

impl Node {
    pub(crate) async fn admitted(&self, key: &[u8], limit: &Limit, calls: usize) -> usize {
        let mut admitted = 0;
        for _ in 0..calls {
            admitted += usize::from(self.store.check(key, limit, 1).await.unwrap().allowed);
        }
        admitted
    }
}

/// Waits (on tokio's paused clock) until the breaker has closed and the debts are paid.
pub(crate) async fn until_settled(node: &Node) {
    for _ in 0..1_000 {
        let stats = node.store.stats();
        if !stats.breaker_open && stats.debts == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("not settled: {:?}", node.store.stats());
}

pub(crate) fn hourly(burst: u64) -> Limit {
    Limit::per_hour(burst).burst(burst).build().unwrap()
}

/// `Store` for a test remote with an `inner: MemoryStore`: reserve by its `Remote::decide`,
/// refund and reset by the inner store.
#[macro_export]
macro_rules! store_by_decide {
    ($remote:ty) => {
        impl tollgate_store::Store for $remote {
            async fn reserve(
                &self,
                checks: &[tollgate_store::Check<'_>],
            ) -> Result<tollgate_store::Reserved, tollgate_store::StoreError> {
                let reply = tollgate_store::remote::Remote::decide(self, checks, &[]).await?;
                Ok(tollgate_store::Reserved {
                    held: reply.held,
                    ..tollgate_store::Reserved::at(reply.decisions, reply.now_ns)
                })
            }

            async fn refund(&self, refunds: &[tollgate_store::Refund<'_>]) -> Result<(), tollgate_store::StoreError> {
                self.inner.refund(refunds).await
            }

            async fn reset(
                &self,
                scope: &str,
                key: &[u8],
                limit: &tollgate_store::Limit,
            ) -> Result<(), tollgate_store::StoreError> {
                self.inner.reset(scope, key, limit).await
            }
        }
    };
}

/// What a call of several checks fails with when its first check's server answered `reply` (its
/// first decision) and every other check's server timed out (the call may have run there).
pub(crate) fn failed_after_first(
    checks: &[tollgate_store::Check<'_>],
    reply: &tollgate_store::remote::Reply,
) -> tollgate_store::StoreError {
    use tollgate_store::remote::{Decided, Partial};
    let (decision, snapshot) = (reply.decisions[0], reply.snapshots[0]);
    let mut decided = vec![None; checks.len()];
    decided[0] = Some(Decided { decision, snapshot, consumed: decision.allowed && checks[0].cost > 0, held: false });
    let error = tollgate_store::StoreError::Timeout(Duration::from_millis(50));
    tollgate_store::StoreError::Partial(Box::new(Partial { decided, failed: (1..checks.len()).collect(), error }))
}
