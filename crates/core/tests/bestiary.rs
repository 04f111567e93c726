//! The off-by-one table of "Rate Limiter Algorithm Zoo: GCRA, Sliding Window, and the Off-by-One Tax": the four (tolerance, comparison) pairs of a hand-written GCRA,
//! hammered at 10/s with burst 10 by a client that retries every microsecond for 3 s.
//! Only `(burst-1)*T` with `>=` is right; each other pair over- or under-grants by one, and
//! tollgate's GCRA must make exactly the right pair's decisions.

use tollgate_core::algorithm::{Gcra, RateState};
use tollgate_core::{Error, Limit};

const US: u64 = 1_000;
const MS: u64 = 1_000_000;
const SEC: u64 = 1_000_000_000;
const T: u64 = 100 * MS;
const BURST: u64 = 10;

/// A textbook GCRA as people write it: allowed iff `now >= tat - tau` (or `>`), `tat` stored.
#[derive(Clone, Copy, Debug)]
struct Variant {
    tau: u64,
    strict: bool,
}

impl Variant {
    fn allows(self, tat: &mut u64, now: u64) -> bool {
        let tat_now = (*tat).max(now);
        // `now >= tat - tau`  <=>  `tat - now <= tau`;  `now > tat - tau`  <=>  `tat - now < tau`.
        let ok = if self.strict { tat_now - now < self.tau } else { tat_now - now <= self.tau };
        if ok {
            *tat = tat_now + T;
        }
        ok
    }
}

/// What a hammering client sees: (admitted at t = 0, admitted in [0, 3 s], in [0, 3 s), and in
/// [0, 3.0009 s], the seed's own run length). The seed's table (11/41, 10/41, 9/39, 10/40) is
/// these columns: each wrong pair differs from the right one in at least one of them.
fn hammer(mut allows: impl FnMut(u64) -> bool) -> (u64, u64, u64, u64) {
    // 64 clients all fire at t = 0; afterwards one retry per microsecond takes every slot.
    let at_zero: u64 = (0..64).map(|_| u64::from(allows(0))).sum();
    let (mut closed, mut open, mut seeds_run) = (at_zero, at_zero, at_zero);
    for now in (US..=3 * SEC + 900 * US).step_by(1_000) {
        if allows(now) {
            closed += u64::from(now <= 3 * SEC);
            open += u64::from(now < 3 * SEC);
            seeds_run += 1;
        }
    }
    (at_zero, closed, open, seeds_run)
}

fn run_variant(variant: Variant) -> (u64, u64, u64, u64) {
    let mut tat = 0;
    hammer(|now| variant.allows(&mut tat, now))
}

fn run_tollgate() -> (u64, u64, u64, u64) {
    let limit = Limit::per_second(10).burst(BURST).build().unwrap();
    let mut state = Gcra::default();
    // An epoch offset keeps the run realistic; decisions depend only on differences.
    let origin = 1_700_000_000 * SEC;
    hammer(|now| state.check(origin + now, &limit, 1).unwrap().allowed)
}

#[test]
fn only_burst_minus_one_with_ge_is_right_and_tollgate_matches_it() {
    let right = run_variant(Variant { tau: (BURST - 1) * T, strict: false });
    assert_eq!(right, (10, 40, 39, 40), "burst 10; 10 + 30 refills in [0, 3 s]; the 3 s slot excluded in [0, 3 s)");
    assert_eq!(run_tollgate(), right, "tollgate's GCRA is the right row");

    // burst*T with >=: one extra at once, and one extra in every window.
    assert_eq!(run_variant(Variant { tau: BURST * T, strict: false }), (11, 41, 40, 41));
    // burst*T with >: the right burst at one instant, but an eleventh a microsecond later and every
    // later slot a microsecond early, so [0, 3 s) admits 40 instead of 39 (the seed's 41 at 3.0009 s).
    assert_eq!(run_variant(Variant { tau: BURST * T, strict: true }), (10, 40, 40, 41));
    // (burst-1)*T with >: one short at once, and one short over [0, 3 s].
    assert_eq!(run_variant(Variant { tau: (BURST - 1) * T, strict: true }), (9, 39, 39, 40));
}

/// "Rate Limiter Algorithm Zoo: GCRA, Sliding Window, and the Off-by-One Tax": with burst = 0, `tau = (burst-1)*T` is negative and the classic check admits every
/// other slot, a silent half-throttle. tollgate refuses the limit instead.
#[test]
fn burst_zero_is_refused_not_a_silent_half_throttle() {
    let err = Limit::per_second(10).burst(0).build().unwrap_err();
    assert_eq!(err, Error::ZeroBurst);
    assert!(err.to_string().contains("burst"), "message names the parameter: {err}");
}
