//! Steady load on a store, every call's outcome recorded with its instant: for tests that change
//! the store's topology (a killed primary, a migrated slot, a Sentinel switch) mid-run and then
//! read when each key stopped, and started again, being decided by the store.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tollgate_core::Limit;

use crate::Store;

/// What one call answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallOutcome {
    /// Admitted.
    Allowed,
    /// Denied.
    Denied,
    /// The store failed the call (its text).
    Error(String),
}

/// One call: when it started (from the load's start), which key, what it answered.
#[derive(Debug, Clone)]
pub struct Call {
    /// When the call started, from [`Load::start`].
    pub at: Duration,
    /// The index of its key.
    pub key: usize,
    /// Its answer.
    pub outcome: CallOutcome,
}

/// Tasks calling a store in a loop until stopped.
#[derive(Debug)]
pub struct Load {
    started: Instant,
    stop: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    calls: Arc<Mutex<Vec<Call>>>,
}

impl Load {
    /// Starts one task per key, each checking its key under `limit` every `every`.
    pub fn start<S: Store + Send + Sync + 'static>(
        store: Arc<S>,
        keys: Vec<Vec<u8>>,
        limit: &Limit,
        every: Duration,
    ) -> Self {
        let started = Instant::now();
        let stop = Arc::new(AtomicBool::new(false));
        let calls = Arc::new(Mutex::new(Vec::new()));
        let tasks = keys
            .into_iter()
            .enumerate()
            .map(|(index, key)| {
                let (store, limit, stop, calls) = (store.clone(), limit.clone(), stop.clone(), calls.clone());
                tokio::spawn(async move {
                    let mut ticks = tokio::time::interval(every);
                    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                    while !stop.load(Ordering::Relaxed) {
                        ticks.tick().await;
                        let at = started.elapsed();
                        let outcome = match store.check(&key, &limit, 1).await {
                            Ok(d) if d.allowed => CallOutcome::Allowed,
                            Ok(_) => CallOutcome::Denied,
                            Err(e) => CallOutcome::Error(e.to_string()),
                        };
                        calls.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(Call {
                            at,
                            key: index,
                            outcome,
                        });
                    }
                })
            })
            .collect();
        Load { started, stop, tasks, calls }
    }

    /// How long the load has run.
    #[must_use]
    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    /// Stops the tasks and returns every call, in the order they ended.
    pub async fn stop(self) -> Vec<Call> {
        self.stop.store(true, Ordering::Relaxed);
        for task in self.tasks {
            let _ = task.await;
        }
        std::mem::take(&mut *self.calls.lock().unwrap_or_else(std::sync::PoisonError::into_inner))
    }
}
