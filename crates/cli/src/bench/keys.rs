//! Which key each request uses: `{key}` in a command, URL, body or descriptor is replaced by
//! `PREFIX` and a key number drawn uniformly or Zipf-distributed over `--keys N` keys.
//!
//! Zipf(s) draws key `k` (0-based) with probability proportional to `1 / (k + 1)^s`, by binary
//! search in a precomputed cumulative table, so a draw is exact and O(log N) at any `s`; the
//! table is why `--zipf` bounds `--keys`.

use std::sync::Arc;

/// The most keys `--zipf` takes: its table holds 8 bytes per key.
pub(crate) const MAX_ZIPF_KEYS: u64 = 10_000_000;

/// How keys are drawn.
#[derive(Debug, Clone)]
pub(crate) struct Keys {
    prefix: Vec<u8>,
    draw: Draw,
}

#[derive(Debug, Clone)]
enum Draw {
    Uniform(u64),
    /// Cumulative probabilities, the last one 1.
    Zipf(Arc<[f64]>),
}

impl Keys {
    /// `count` keys named `prefix0` … `prefix{count-1}`, drawn uniformly or Zipf(`zipf`).
    pub(crate) fn new(prefix: &str, count: u64, zipf: Option<f64>) -> Result<Keys, String> {
        if count == 0 {
            return Err("--keys must be at least 1".into());
        }
        let draw = match zipf {
            None => Draw::Uniform(count),
            Some(s) if !(s.is_finite() && s > 0.0) => return Err(format!("--zipf must be a positive number, got {s}")),
            Some(_) if count > MAX_ZIPF_KEYS => {
                return Err(format!("--zipf takes at most {MAX_ZIPF_KEYS} keys (--keys {count})"));
            }
            Some(s) => Draw::Zipf(zipf_table(count, s)),
        };
        Ok(Keys { prefix: prefix.as_bytes().to_vec(), draw })
    }

    /// One key number.
    pub(crate) fn pick(&self, rng: &mut Rng) -> u64 {
        match &self.draw {
            Draw::Uniform(1) => 0,
            Draw::Uniform(n) => rng.below(*n),
            Draw::Zipf(cdf) => {
                let u = rng.unit();
                let k = cdf.partition_point(|&p| p < u);
                // `u < 1 = cdf[last]`, so `k` is in range; the `min` only guards rounding.
                (k as u64).min(cdf.len() as u64 - 1)
            }
        }
    }

    /// Key number `k` as bytes: the prefix and the decimal number.
    pub(crate) fn name(&self, k: u64) -> Vec<u8> {
        let mut name = self.prefix.clone();
        name.extend_from_slice(k.to_string().as_bytes());
        name
    }
}

fn zipf_table(count: u64, s: f64) -> Arc<[f64]> {
    let mut total = 0.0;
    let mut cdf: Vec<f64> = (1..=count)
        .map(|rank| {
            total += (rank as f64).powf(-s);
            total
        })
        .collect();
    for p in &mut cdf {
        *p /= total;
    }
    if let Some(last) = cdf.last_mut() {
        *last = 1.0;
    }
    cdf.into()
}

/// SplitMix64: a small, fast generator, one per connection so draws never contend.
#[derive(Debug, Clone)]
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn seeded(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0x2545_F491_4F6C_DD1D)
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (Lemire's multiply-shift; its bias is below 2^-64 × n).
    fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }

    /// Uniform in `[0, 1)`, 53 bits.
    fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// A text with `{key}` placeholders, split once so rendering is a few copies.
#[derive(Debug, Clone)]
pub(crate) struct Template {
    /// Literal pieces; a key goes between each two.
    pieces: Vec<Vec<u8>>,
}

impl Template {
    pub(crate) fn new(text: &str) -> Template {
        Template { pieces: text.split("{key}").map(|p| p.as_bytes().to_vec()).collect() }
    }

    /// Whether the text has a `{key}` at all.
    pub(crate) fn has_key(&self) -> bool {
        self.pieces.len() > 1
    }

    /// Appends the text with every `{key}` replaced by `key`.
    pub(crate) fn render_into(&self, key: &[u8], out: &mut Vec<u8>) {
        for (i, piece) in self.pieces.iter().enumerate() {
            if i > 0 {
                out.extend_from_slice(key);
            }
            out.extend_from_slice(piece);
        }
    }

    pub(crate) fn rendered_len(&self, key: &[u8]) -> usize {
        self.pieces.iter().map(Vec::len).sum::<usize>() + key.len() * (self.pieces.len() - 1)
    }

    pub(crate) fn render(&self, key: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.rendered_len(key));
        self.render_into(key, &mut out);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_replace_every_placeholder() {
        let t = Template::new("CL.THROTTLE {key} 15 30 60 1 {key}");
        assert!(t.has_key());
        assert_eq!(t.render(b"k:1"), b"CL.THROTTLE k:1 15 30 60 1 k:1");
        assert_eq!(t.rendered_len(b"k:1"), t.render(b"k:1").len());
        assert!(!Template::new("INCR counter").has_key());
    }

    #[test]
    fn uniform_draws_cover_every_key_evenly() {
        let keys = Keys::new("k", 10, None).unwrap();
        let mut rng = Rng::seeded(1);
        let mut seen = [0u32; 10];
        for _ in 0..100_000 {
            seen[usize::try_from(keys.pick(&mut rng)).unwrap()] += 1;
        }
        for count in seen {
            assert!((9_000..11_000).contains(&count), "{seen:?}");
        }
        assert_eq!(keys.name(7), b"k7");
    }

    #[test]
    fn zipf_draws_follow_the_power_law() {
        // s = 1 over 100 keys: P(k) = 1 / ((k + 1) H_100), H_100 ≈ 5.187.
        let keys = Keys::new("k", 100, Some(1.0)).unwrap();
        let mut rng = Rng::seeded(2);
        let n = 200_000;
        let mut seen = vec![0u32; 100];
        for _ in 0..n {
            seen[usize::try_from(keys.pick(&mut rng)).unwrap()] += 1;
        }
        let harmonic: f64 = (1..=100).map(|k| 1.0 / f64::from(k)).sum();
        for (k, expected) in [(0usize, 1.0), (1, 0.5), (9, 0.1), (99, 0.01)] {
            let expected = expected / harmonic * f64::from(n);
            let got = f64::from(seen[k]);
            assert!((got - expected).abs() < 0.1 * expected + 30.0, "key {k}: {got} vs {expected}");
        }
    }

    #[test]
    fn bad_key_options_are_refused() {
        assert!(Keys::new("k", 0, None).is_err());
        assert!(Keys::new("k", 10, Some(0.0)).is_err());
        assert!(Keys::new("k", 10, Some(f64::NAN)).is_err());
        assert!(Keys::new("k", MAX_ZIPF_KEYS + 1, Some(1.0)).is_err());
        assert_eq!(Keys::new("k", 1, None).unwrap().pick(&mut Rng::seeded(3)), 0);
    }
}
