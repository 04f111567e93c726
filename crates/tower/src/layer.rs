//! [`RateLimitLayer`]: wraps services in [`RateLimit`](crate::RateLimit).

use std::sync::Arc;

use prometheus_client::registry::Registry;
use tollgate_engine::Engine;
use tollgate_rules::Rules;
use tollgate_store::Store;
use tower_layer::Layer;

use crate::options::Options;
use crate::service::{RateLimit, Shared};
use crate::shadow::Shadow;

/// Applies a policy engine to every request of the wrapped service. Cheap to clone.
pub struct RateLimitLayer<S> {
    pub(crate) engine: Arc<Engine<S>>,
    pub(crate) options: Options,
    /// What its fakes learned of the real responses (shared by its clones and services).
    shadow: Arc<Shadow>,
    registry: Option<Arc<Registry>>,
}

impl<S> Clone for RateLimitLayer<S> {
    fn clone(&self) -> Self {
        RateLimitLayer {
            engine: self.engine.clone(),
            options: self.options,
            shadow: self.shadow.clone(),
            registry: self.registry.clone(),
        }
    }
}

impl<S: Store> RateLimitLayer<S> {
    /// A layer applying `rules` with `store` (default options; its metrics in its own registry,
    /// see [`render_metrics`](Self::render_metrics)).
    pub fn new(rules: Rules, store: S) -> Self {
        Self::with_options(rules, store, Options::default())
    }

    /// A layer with these options.
    pub fn with_options(rules: Rules, store: S, options: Options) -> Self {
        let mut registry = Registry::with_prefix("tollgate");
        let engine = Arc::new(Engine::builder(store, rules).routes(options.routes).build(&mut registry));
        let shadow = Arc::new(Shadow::new(options.shadow_ban_max_waiting));
        shadow.register(&mut registry);
        RateLimitLayer { engine, options, shadow, registry: Some(Arc::new(registry)) }
    }

    /// A layer over an engine built elsewhere (whose metrics its builder registered; the layer's
    /// own, see [`register_metrics`](Self::register_metrics)).
    pub fn from_engine(engine: Arc<Engine<S>>, options: Options) -> Self {
        let shadow = Arc::new(Shadow::new(options.shadow_ban_max_waiting));
        RateLimitLayer { engine, options, shadow, registry: None }
    }

    /// Registers the layer's own metrics in `registry` (whose prefix they take), for a layer
    /// built [`from_engine`](Self::from_engine): `shadow_ban_fakes_total{rule, delay}` and
    /// `shadow_ban_waiting` (see [`shadow`](crate::shadow)). A layer built
    /// [`with_options`](Self::with_options) has them in its own registry.
    pub fn register_metrics(&self, registry: &mut Registry) {
        self.shadow.register(registry);
    }

    /// The engine.
    pub fn engine(&self) -> &Arc<Engine<S>> {
        &self.engine
    }

    /// The engine's metrics in the OpenMetrics text format (empty for a layer built
    /// [`from_engine`](Self::from_engine): its registry is its builder's).
    pub fn render_metrics(&self) -> String {
        let mut text = String::new();
        if let Some(registry) = &self.registry {
            // Writing into a String cannot fail.
            let _ = prometheus_client::encoding::text::encode(&mut text, registry);
        }
        text
    }
}

impl<I, S> Layer<I> for RateLimitLayer<S> {
    type Service = RateLimit<I, S>;

    fn layer(&self, inner: I) -> Self::Service {
        let shared = Shared { engine: self.engine.clone(), options: self.options, shadow: self.shadow.clone() };
        RateLimit { inner, shared: Arc::new(shared) }
    }
}
