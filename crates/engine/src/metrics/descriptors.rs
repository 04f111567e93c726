//! envoyproxy/ratelimit's per-limit counters under the names its users' dashboards expect
//! (`ratelimit_service_rate_limit_{total_hits,over_limit,near_limit,within_limit,shadow_mode}`,
//! as its Prometheus mapping names them), counted by the engine as it decides Envoy's
//! descriptors (see `descriptors`), besides tollgate's own metrics. They carry no prefix:
//! [`DescriptorMetrics::register`] takes the root registry.
//!
//! Labels: `domain`, and `descriptor`, the limit's stats key within it (`key_value.key2`): the
//! configuration's path, so the series are bounded by the configured limits; request values
//! appear only where the configuration asks for them (`detailed_metric`). Every counter counts
//! hits (`hits_addend`), not requests, as envoyproxy/ratelimit does: `total_hits` all of them,
//! `over_limit` those refused, `within_limit` those admitted, `near_limit` those admitted with
//! the limit 80 % used or more after them, `shadow_mode` those a shadow-mode limit would have
//! refused. A series appears with its first hit.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

/// The share of a limit used from which an admitted hit is also counted as near the limit.
const NEAR_LIMIT_RATIO: f64 = 0.8;

/// One limit's series.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Labels {
    domain: String,
    descriptor: String,
}

/// The counters (registered by [`DescriptorMetrics::register`]).
#[derive(Debug, Clone, Default)]
pub struct DescriptorMetrics {
    total_hits: Family<Labels, Counter>,
    over_limit: Family<Labels, Counter>,
    near_limit: Family<Labels, Counter>,
    within_limit: Family<Labels, Counter>,
    shadow_mode: Family<Labels, Counter>,
}

/// What happened to one descriptor's hits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DescriptorOutcome {
    /// Admitted.
    Within {
        /// What the limit has left after these hits.
        remaining: u64,
        /// What it holds in all.
        capacity: u64,
    },
    /// Refused.
    Over,
    /// Over a shadow-mode limit: reported OK.
    Shadow,
    /// Within the limit, but the request was refused by another of its descriptors: nothing was
    /// taken (only `total_hits` counts it).
    NotCounted,
}

impl DescriptorMetrics {
    /// Registers the counters in `registry`: the root one, as their names carry no prefix. An
    /// engine that decides no Envoy descriptor need not register them.
    pub fn register(&self, registry: &mut Registry) {
        let metrics = self;
        let families = [
            (
                "ratelimit_service_rate_limit_total_hits",
                "Hits on a limit (envoyproxy/ratelimit's name)",
                &metrics.total_hits,
            ),
            ("ratelimit_service_rate_limit_over_limit", "Hits refused by a limit", &metrics.over_limit),
            (
                "ratelimit_service_rate_limit_near_limit",
                "Admitted hits with the limit 80% used or more",
                &metrics.near_limit,
            ),
            ("ratelimit_service_rate_limit_within_limit", "Hits admitted by a limit", &metrics.within_limit),
            (
                "ratelimit_service_rate_limit_shadow_mode",
                "Hits a shadow-mode limit would have refused",
                &metrics.shadow_mode,
            ),
        ];
        for (name, help, family) in families {
            registry.register(name, help, family.clone());
        }
    }

    /// Counts `hits` on the limit with stats key `metric_key` (`domain.key_value...`).
    pub(crate) fn record(&self, metric_key: &str, hits: u64, outcome: DescriptorOutcome) {
        if hits == 0 {
            return;
        }
        let (domain, descriptor) = metric_key.split_once('.').unwrap_or((metric_key, ""));
        let labels = Labels { domain: domain.to_string(), descriptor: descriptor.to_string() };
        self.total_hits.get_or_create(&labels).inc_by(hits);
        match outcome {
            DescriptorOutcome::Over => {
                self.over_limit.get_or_create(&labels).inc_by(hits);
            }
            DescriptorOutcome::Shadow => {
                self.shadow_mode.get_or_create(&labels).inc_by(hits);
            }
            DescriptorOutcome::NotCounted => {}
            DescriptorOutcome::Within { remaining, capacity } => {
                self.within_limit.get_or_create(&labels).inc_by(hits);
                #[allow(clippy::cast_precision_loss)] // a ratio; exactness is not needed here
                let used = (capacity.saturating_sub(remaining)) as f64 / capacity.max(1) as f64;
                if used >= NEAR_LIMIT_RATIO {
                    self.near_limit.get_or_create(&labels).inc_by(hits);
                }
            }
        }
    }
}
