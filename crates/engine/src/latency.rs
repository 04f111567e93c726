//! `tollgate_decision_duration_seconds{frontend}`: how long a decision took, from the moment a
//! front end asked the engine (or, for Envoy's gRPC service, its store) to the answer, store
//! call, failure policy and mitigation included; parsing the request and writing the reply are
//! not. `frontend` is one of a fixed set ([`Frontend`]), never a value a client chose.
//!
//! **Buckets** double from 1 µs to 2²² µs (about 4.2 s, beyond any store timeout), then `+Inf`:
//! the memory store decides in about a microsecond, a Redis round trip takes tens or hundreds.
//!
//! **Cost.** prometheus-client's `Histogram` takes a mutex on every observation, which every core
//! deciding at once would queue on; [`Latency`] is lock-free instead: the bucket is found in
//! constant time from the nanoseconds' leading zeros, and an observation is two relaxed atomic
//! additions (the bucket and the sum; the count is the buckets' total, read when scraped, so
//! `_count` always equals the `+Inf` bucket). The engine times by its injected clock (the system
//! clock reads its timer in about half the time `std::time::Instant` takes), so a manual clock
//! that is not moved shows every decision at 0 s.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use prometheus_client::encoding::{EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::{MetricType, TypedMetric};

/// Finite buckets: upper bounds 1 µs × 2^i for i in `0..FINITE`.
const FINITE: usize = 23;

/// Which front end asked for a decision (the `frontend` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Frontend {
    /// `tollgate serve`'s RESP listener (`CL.THROTTLE`, `TG.CHECK`, `TG.LIMIT`...).
    Resp,
    /// `tollgate serve`'s HTTP listener (`POST /v1/check`).
    Http,
    /// `tollgate serve`'s Envoy rate-limit service (`ShouldRateLimit`).
    Grpc,
    /// The tower/axum middleware, and so `tollgate proxy` (rules on request characteristics).
    Middleware,
}

impl Frontend {
    pub(crate) const ALL: [Frontend; 4] = [Frontend::Resp, Frontend::Http, Frontend::Grpc, Frontend::Middleware];

    /// The `frontend` label.
    #[must_use]
    pub fn label(self) -> &'static str {
        match self {
            Frontend::Resp => "resp",
            Frontend::Http => "http",
            Frontend::Grpc => "grpc",
            Frontend::Middleware => "middleware",
        }
    }

    /// The position in [`Frontend::ALL`] (the declaration order).
    pub(crate) fn index(self) -> usize {
        self as usize
    }
}

/// A lock-free latency histogram (see the module docs). Clones share their counts.
#[derive(Debug, Clone, Default)]
pub struct Latency(Arc<Inner>);

#[derive(Debug, Default)]
struct Inner {
    /// Observations per bucket (not cumulative); the last one is `+Inf`.
    buckets: [AtomicU64; FINITE + 1],
    /// The sum of the observations, in nanoseconds.
    sum_ns: AtomicU64,
}

/// The bucket of an observation of `ns` nanoseconds: the first whose bound is at least `ns`.
fn bucket(ns: u64) -> usize {
    let micros = ns.div_ceil(1_000);
    if micros <= 1 {
        return 0;
    }
    // The smallest i with 2^i >= micros.
    let i = (u64::BITS - (micros - 1).leading_zeros()) as usize;
    i.min(FINITE)
}

/// The upper bound of finite bucket `i`, in seconds.
fn upper_bound(i: usize) -> f64 {
    // Scaling by a power of two is exact: the bounds print as 1e-6, 2e-6, 4e-6...
    f64::from(1u32 << i) * 1e-6
}

impl Latency {
    /// Counts one decision that took `elapsed`.
    pub fn observe(&self, elapsed: Duration) {
        let ns = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
        self.0.buckets[bucket(ns)].fetch_add(1, Ordering::Relaxed);
        self.0.sum_ns.fetch_add(ns, Ordering::Relaxed);
    }

    /// The observations so far.
    #[must_use]
    pub fn count(&self) -> u64 {
        self.0.buckets.iter().map(|b| b.load(Ordering::Relaxed)).sum()
    }
}

impl TypedMetric for Latency {
    const TYPE: MetricType = MetricType::Histogram;
}

impl EncodeMetric for Latency {
    fn encode(&self, mut encoder: MetricEncoder<'_>) -> Result<(), std::fmt::Error> {
        let counts: Vec<u64> = self.0.buckets.iter().map(|b| b.load(Ordering::Relaxed)).collect();
        let buckets: Vec<(f64, u64)> = counts
            .iter()
            .enumerate()
            .map(|(i, &n)| (if i < FINITE { upper_bound(i) } else { f64::INFINITY }, n))
            .collect();
        #[allow(clippy::cast_precision_loss)] // seconds for a dashboard: nanosecond exactness is not needed
        let sum = self.0.sum_ns.load(Ordering::Relaxed) as f64 / 1e9;
        encoder.encode_histogram::<NoLabelSet>(sum, counts.iter().sum(), &buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        Self::TYPE
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_observation_lands_in_the_first_bucket_whose_bound_holds_it() {
        for (ns, expected) in [
            (0, 0),
            (1, 0),
            (1_000, 0),
            (1_001, 1),
            (2_000, 1),
            (2_001, 2),
            (4_000, 2),
            (4_001, 3),
            (1_000_000, 10),
            (1_024_000, 10),
            (1_024_001, 11),
            ((1 << 22) * 1_000, 22),
            ((1 << 22) * 1_000 + 1, FINITE),
            (u64::MAX, FINITE),
        ] {
            assert_eq!(bucket(ns), expected, "{ns} ns");
            if expected < FINITE {
                #[allow(clippy::cast_precision_loss)]
                let seconds = ns as f64 / 1e9;
                assert!(seconds <= upper_bound(expected) * (1.0 + 1e-12), "{ns} ns within bucket {expected}");
            }
        }
        assert_eq!(upper_bound(3), 8e-6);
        assert_eq!(upper_bound(FINITE - 1), 4.194304);
    }

    #[test]
    fn the_exposition_is_a_cumulative_histogram_whose_count_is_its_inf_bucket() {
        let latency = Latency::default();
        for micros in [1, 3, 3, 900, 10_000_000] {
            latency.observe(Duration::from_micros(micros));
        }
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register("decision_duration_seconds", "Seconds per decision", latency.clone());
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(text.contains("# TYPE decision_duration_seconds histogram\n"), "{text}");
        for line in [
            "decision_duration_seconds_count 5\n",
            "decision_duration_seconds_bucket{le=\"0.000001\"} 1\n",
            "decision_duration_seconds_bucket{le=\"0.000004\"} 3\n",
            "decision_duration_seconds_bucket{le=\"0.001024\"} 4\n",
            "decision_duration_seconds_bucket{le=\"4.194304\"} 4\n",
            "decision_duration_seconds_bucket{le=\"+Inf\"} 5\n",
        ] {
            assert!(text.contains(line), "{line:?} in:\n{text}");
        }
        let sum: f64 = text
            .lines()
            .find_map(|l| l.strip_prefix("decision_duration_seconds_sum "))
            .and_then(|v| v.parse().ok())
            .unwrap();
        assert!((sum - 10.000_907).abs() < 1e-9, "{sum}");
        assert_eq!(latency.count(), 5);
    }
}
