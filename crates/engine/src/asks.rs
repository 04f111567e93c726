//! The store half of deciding Envoy's descriptors (see `descriptors`): the checks of the
//! descriptors that have a limit, decided in the order the engine decides a request's rules
//! (`enforce`): the enforced checks all or nothing, in one store call; then the shadow ones
//! (Envoy's `shadow_mode`, the rules' `dry-run`: reported, never refusing) each on its own,
//! counted only when the request was admitted. Unlike a rule, a descriptor's status is reported
//! for every check: when the request is refused, those that did not refuse it report their state
//! as a peek would (they consumed nothing).

use tollgate_core::Decision;
use tollgate_store::{Check, Store, StoreError};

/// One check of a request.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ask<'a> {
    /// Its key, limit, scope and cost.
    pub(crate) check: Check<'a>,
    /// Reported, never refusing (Envoy's `shadow_mode`).
    pub(crate) shadow: bool,
}

/// What the engine decided for a request's asks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Asked {
    /// Whether the request was admitted (every enforced ask admitted, and not refused before).
    pub(crate) admitted: bool,
    /// One decision per ask, in order: an enforced ask's own (denied if it refused the request,
    /// else its state, consumed only if the request was admitted); a shadow ask's (consumed only if
    /// the request was admitted; a denial refuses nothing).
    pub(crate) decisions: Vec<Decision>,
}

/// Decides `asks` on `store` (see the module docs). `refused`: the request is refused already (a
/// descriptor always over its limit): nothing is consumed, every ask reports as a peek.
pub(crate) async fn decide<T: Store>(store: &T, asks: &[Ask<'_>], refused: bool) -> Result<Asked, StoreError> {
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
