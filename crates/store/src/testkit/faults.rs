//! A [`Remote`] whose calls fail on demand, for tests of the failure policy without a network:
//! calls can be refused before they reach the store, or reach it and lose their reply (the store
//! admitted, the caller never hears of it: a timeout after the work was done).

use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};

use tollgate_core::Limit;

use crate::remote::{Charge, Remote, Reply};
use crate::{Check, Refund, Reserved, Store, StoreError};

/// What happens to the next calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Fault {
    /// Calls go through.
    None = 0,
    /// Calls fail before reaching the store (a dead backend).
    Refuse = 1,
    /// Calls reach the store, which decides, but the reply is lost (a slow or paused backend).
    LoseReply = 2,
}

/// `inner` with injectable faults.
#[derive(Debug)]
pub struct Faulty<R> {
    inner: R,
    fault: AtomicU8,
    reached: AtomicU64,
}

impl<R> Faulty<R> {
    /// `inner`, healthy.
    pub fn new(inner: R) -> Self {
        Faulty { inner, fault: AtomicU8::new(Fault::None as u8), reached: AtomicU64::new(0) }
    }

    /// Sets what happens to the next calls.
    pub fn set(&self, fault: Fault) {
        self.fault.store(fault as u8, Ordering::SeqCst);
    }

    /// Calls that reached the store (probes excluded).
    pub fn reached(&self) -> u64 {
        self.reached.load(Ordering::SeqCst)
    }

    /// The wrapped store.
    pub fn inner(&self) -> &R {
        &self.inner
    }

    fn fault(&self) -> Fault {
        match self.fault.load(Ordering::SeqCst) {
            1 => Fault::Refuse,
            2 => Fault::LoseReply,
            _ => Fault::None,
        }
    }
}

fn injected() -> StoreError {
    StoreError::Backend("injected fault".into())
}

impl<R: Remote> Store for Faulty<R> {
    async fn reserve(&self, checks: &[Check<'_>]) -> Result<Reserved, StoreError> {
        let reply = self.decide(checks, &[]).await?;
        Ok(Reserved { held: reply.held, ..Reserved::at(reply.decisions, reply.now_ns) })
    }

    async fn refund(&self, refunds: &[Refund<'_>]) -> Result<(), StoreError> {
        match self.fault() {
            Fault::None => self.inner.refund(refunds).await,
            Fault::Refuse => Err(injected()),
            Fault::LoseReply => {
                let _ = self.inner.refund(refunds).await;
                Err(StoreError::Timeout(std::time::Duration::from_millis(50)))
            }
        }
    }

    async fn reset(&self, scope: &str, key: &[u8], limit: &Limit) -> Result<(), StoreError> {
        self.inner.reset(scope, key, limit).await
    }

    async fn carry(&self, scope: &str, key: &[u8], from: &Limit, to: &Limit) -> Result<u64, StoreError> {
        self.inner.carry(scope, key, from, to).await
    }

    /// On the inner store, without a fault (the faults are the decisions').
    async fn hold(&self, scope: &str, key: &[u8], hold_ns: u64) -> Result<(), StoreError> {
        self.inner.hold(scope, key, hold_ns).await
    }
}

impl<R: Remote> Remote for Faulty<R> {
    async fn decide(&self, checks: &[Check<'_>], charges: &[Charge<'_>]) -> Result<Reply, StoreError> {
        match self.fault() {
            Fault::Refuse => Err(injected()),
            Fault::None => {
                self.reached.fetch_add(1, Ordering::SeqCst);
                self.inner.decide(checks, charges).await
            }
            Fault::LoseReply => {
                self.reached.fetch_add(1, Ordering::SeqCst);
                let _ = self.inner.decide(checks, charges).await;
                Err(StoreError::Timeout(std::time::Duration::from_millis(50)))
            }
        }
    }

    async fn probe(&self) -> Result<(), StoreError> {
        if self.fault() == Fault::None { self.inner.probe().await } else { Err(injected()) }
    }
}
