//! Checks a front end builds itself rather than from the rules: Envoy's descriptors, matched to
//! limits by `tollgate-envoy`. The engine decides them in the order it decides a request's rules
//! ([`enforce`](crate::enforce)), timed as the front end's decisions, store errors counted in its
//! metrics: the enforced checks all or nothing, in one store call; then the shadow ones (Envoy's
//! `shadow_mode`, the rules' `dry-run`: reported, never refusing) each on its own, counted only
//! when the request was admitted. Unlike a rule, a descriptor's status is reported for every
//! check: when the request is refused, those that did not refuse it report their state as a
//! peek would (they consumed nothing).
//!
//! [`Engine`]'s method here: [`Engine::admit_asks`].

use tollgate_core::Decision;
use tollgate_store::{Check, Store, StoreError};

use crate::{Engine, Frontend};

/// One check of a request.
#[derive(Debug, Clone, Copy)]
pub struct Ask<'a> {
    /// Its key, limit, scope and cost.
    pub check: Check<'a>,
    /// Reported, never refusing (Envoy's `shadow_mode`).
    pub shadow: bool,
}

/// What the engine decided for a request's asks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Asked {
    /// Whether the request was admitted (every enforced ask admitted, and not refused before).
    pub admitted: bool,
    /// One decision per ask, in order: an enforced ask's own (denied if it refused the request,
    /// else its state, consumed only if the request was admitted); a shadow ask's (consumed only if
    /// the request was admitted; a denial refuses nothing).
    pub decisions: Vec<Decision>,
}

impl<S: Store> Engine<S> {
    /// Decides `asks` (see the module docs) through `store` (the front end's own, e.g. with a
    /// shorter timeout), timed as `frontend`'s decision. `refused`: the front end refuses the
    /// request already (a limit of zero): nothing is consumed, every ask reports as a peek.
    pub async fn admit_asks<T: Store>(
        &self,
        frontend: Frontend,
        store: &T,
        asks: &[Ask<'_>],
        refused: bool,
    ) -> Result<Asked, StoreError> {
        self.timed(frontend, async { self.counted(decide(store, asks, refused).await) }).await
    }
}

async fn decide<T: Store>(store: &T, asks: &[Ask<'_>], refused: bool) -> Result<Asked, StoreError> {
    let enforced: Vec<Check<'_>> = asks
        .iter()
        .filter(|a| !a.shadow)
        .map(|a| if refused { Check { cost: 0, ..a.check } } else { a.check })
        .collect();
    let decided = if enforced.is_empty() { Vec::new() } else { store.check_all(&enforced).await? };
    let admitted = !refused && decided.iter().all(|d| d.allowed);
    let mut decided = decided.into_iter();
    let mut decisions = Vec::with_capacity(asks.len());
    for ask in asks {
        decisions.push(if ask.shadow {
            let counted = if admitted { ask.check } else { Check { cost: 0, ..ask.check } };
            store.check_one(counted).await?
        } else {
            decided.next().ok_or(StoreError::NoChecks)?
        });
    }
    Ok(Asked { admitted, decisions })
}
