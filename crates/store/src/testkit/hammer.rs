//! Many concurrent callers on one key, on a frozen clock: the admitted count must equal the
//! limit's capacity exactly (zero over-grant, and no lost admission either).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tollgate_core::{Algorithm, Limit, LimitBuilder};

use crate::Store;

/// The limits the concurrency tests hammer: one per algorithm, capacity 1,000.
#[must_use]
pub fn limits() -> Vec<Limit> {
    Algorithm::ALL
        .iter()
        .map(|&a| "1000/s".parse::<LimitBuilder>().expect("limit").algorithm(a).build().expect("valid"))
        .collect()
}

/// `tasks` tokio tasks (on the current multi-thread runtime) each calling `check(key, limit, 1)`
/// `calls` times; returns how many were admitted.
pub async fn tasks<S: Store + 'static>(store: Arc<S>, key: &str, limit: &Limit, tasks: usize, calls: usize) -> u64 {
    let admitted = Arc::new(AtomicU64::new(0));
    let handles: Vec<_> = (0..tasks)
        .map(|_| {
            let (store, admitted, key, limit) = (store.clone(), admitted.clone(), key.to_string(), limit.clone());
            tokio::spawn(async move {
                for _ in 0..calls {
                    if store.check(key.as_bytes(), &limit, 1).await.expect("check").allowed {
                        admitted.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    for handle in handles {
        handle.await.expect("task");
    }
    admitted.load(Ordering::Relaxed)
}
