//! Virtual clients on a virtual clock: arrival patterns, replay against one key, and the
//! measurements the experiments report.

use tollgate_core::{Algorithm, Limit, State};

/// One algorithm's run of TestOverGrant, kept for the table and the plot.
pub(crate) struct Run {
    pub(crate) algorithm: Algorithm,
    pub(crate) start: u64,
    pub(crate) outcomes: Vec<Outcome>,
}

/// One request of a run: when it arrived and whether it was admitted.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Outcome {
    pub(crate) t: u64,
    pub(crate) allowed: bool,
}

/// Decides `arrivals` (non-decreasing instants, unit cost) for one key under `limit`.
pub(crate) fn replay(limit: &Limit, arrivals: &[u64]) -> Vec<Outcome> {
    let mut state = State::idle(limit);
    arrivals
        .iter()
        .map(|&t| {
            let allowed = state.check(t, limit, 1).expect("unit cost fits every experiment's limit").allowed;
            Outcome { t, allowed }
        })
        .collect()
}

/// `clients` clients firing together at every `tick` from `start` to `start + duration` inclusive:
/// the synchronized goroutines of TestOverGrant in "Rate Limiter Algorithm Zoo: GCRA, Sliding Window,
/// and the Off-by-One Tax".
pub(crate) fn lockstep(clients: usize, start: u64, tick: u64, duration: u64) -> Vec<u64> {
    (0..=duration / tick).flat_map(|k| std::iter::repeat_n(start + k * tick, clients)).collect()
}

/// A Poisson process of `per_second` mean rate over `[start, start + duration)`, from a fixed seed.
pub(crate) fn poisson(seed: u64, per_second: f64, start: u64, duration: u64) -> Vec<u64> {
    let mut rng = SplitMix64(seed);
    let mean_gap_ns = 1e9 / per_second;
    let mut arrivals = Vec::new();
    let mut t = start as f64;
    loop {
        // Exponential gaps; 1 - u is in (0, 1], so the logarithm is finite.
        t += -(1.0 - rng.next_unit()).ln() * mean_gap_ns;
        if t >= (start + duration) as f64 {
            return arrivals;
        }
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        arrivals.push(t as u64);
    }
}

/// The instants of the admitted requests.
pub(crate) fn admitted(outcomes: &[Outcome]) -> Vec<u64> {
    outcomes.iter().filter(|o| o.allowed).map(|o| o.t).collect()
}

/// The most admissions in any window `[t, t + len)`, over sorted instants.
pub(crate) fn busiest_window(admitted: &[u64], len: u64) -> u64 {
    let mut first = 0;
    let mut most = 0;
    for (last, &t) in admitted.iter().enumerate() {
        while admitted[first] + len <= t {
            first += 1;
        }
        most = most.max(last + 1 - first);
    }
    most as u64
}

/// How many of a run's decisions an exact sliding window (`count` in any `(t - period, t]`) would
/// have made differently given the same admitted history: `(wrongly admitted, wrongly denied)`.
/// This is Cloudflare's measure of the sliding window counter's error.
pub(crate) fn wrong_decisions(outcomes: &[Outcome], count: u64, period: u64) -> (u64, u64) {
    let mut window = std::collections::VecDeque::new();
    let (mut wrongly_admitted, mut wrongly_denied) = (0, 0);
    for outcome in outcomes {
        while window.front().is_some_and(|&t: &u64| t + period <= outcome.t) {
            window.pop_front();
        }
        let exact = (window.len() as u64) < count;
        match (outcome.allowed, exact) {
            (true, false) => wrongly_admitted += 1,
            (false, true) => wrongly_denied += 1,
            _ => {}
        }
        if outcome.allowed {
            window.push_back(outcome.t);
        }
    }
    (wrongly_admitted, wrongly_denied)
}

/// SplitMix64: a tiny, well-mixed generator, enough for reproducible arrival times.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    fn next_unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn busiest_window_is_half_open() {
        assert_eq!(busiest_window(&[], 10), 0);
        assert_eq!(busiest_window(&[0, 5, 10, 11], 10), 3);
        assert_eq!(busiest_window(&[0, 0, 0, 10], 10), 3);
    }

    #[test]
    fn poisson_is_reproducible_and_near_its_rate() {
        let a = poisson(7, 100.0, 0, 100_000_000_000);
        assert_eq!(a, poisson(7, 100.0, 0, 100_000_000_000));
        assert!(a.windows(2).all(|w| w[0] <= w[1]));
        assert!((9_000..11_000).contains(&a.len()), "{} arrivals for a mean of 10,000", a.len());
    }

    #[test]
    fn wrong_decisions_compare_with_the_exact_window() {
        let at = |t, allowed| Outcome { t, allowed };
        // count 1 per 10: admitting at 5 is wrong; denying at 10 is right (5 is still in (0, 10]);
        // denying at 30 is wrong (the window (20, 30] is empty).
        let run = [at(0, true), at(5, true), at(10, false), at(30, false)];
        assert_eq!(wrong_decisions(&run, 1, 10), (1, 1));
    }

    #[test]
    fn lockstep_includes_both_ends() {
        assert_eq!(lockstep(2, 10, 5, 10), [10, 10, 15, 15, 20, 20]);
    }
}
