//! [`RateLimitLayer`]: wraps services in [`RateLimit`](crate::RateLimit).

use std::sync::Arc;

use tollgate_rules::Rules;
use tollgate_store::Store;
use tower_layer::Layer;

use crate::guard::{Guard, Options};
use crate::service::RateLimit;

/// Applies `rules` with `store` to every request of the wrapped service. Cheap to clone.
pub struct RateLimitLayer<S> {
    guard: Arc<Guard<S>>,
}

impl<S> Clone for RateLimitLayer<S> {
    fn clone(&self) -> Self {
        RateLimitLayer { guard: self.guard.clone() }
    }
}

impl<S: Store> RateLimitLayer<S> {
    /// A layer with default options (RateLimit fields on 429s only, no legacy headers).
    pub fn new(rules: Rules, store: S) -> Self {
        Self::with_options(rules, store, Options::default())
    }

    /// A layer with these options.
    pub fn with_options(rules: Rules, store: S, options: Options) -> Self {
        RateLimitLayer { guard: Arc::new(Guard::new(rules, store, options)) }
    }

    /// Requests per rule and outcome, in the Prometheus text format.
    pub fn render_metrics(&self) -> String {
        self.guard.stats.render(&self.guard.rules)
    }

    /// Requests that dry-run rules would have mitigated so far.
    pub fn dry_run_hits(&self) -> u64 {
        self.guard.dry_run_hits()
    }
}

impl<I, S> Layer<I> for RateLimitLayer<S> {
    type Service = RateLimit<I, S>;

    fn layer(&self, inner: I) -> Self::Service {
        RateLimit { inner, guard: self.guard.clone() }
    }
}
