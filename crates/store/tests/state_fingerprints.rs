//! Review of issue 41's one-pass fingerprint of a check's state (scope, algorithm, key hashed
//! with the scope's length and the algorithm in one word): triples whose bytes run together
//! across the scope/key boundary, an empty scope against a non-empty one, and one key under
//! every algorithm each keep a state of their own.

use std::sync::Arc;

use tollgate_store::{Algorithm, Check, Limit, ManualClock, MemoryStore};

const T0: u64 = 1_700_000_000_000_000_000;

const ALGORITHMS: [Algorithm; 7] = [
    Algorithm::Gcra,
    Algorithm::TokenBucket,
    Algorithm::LeakyBucket,
    Algorithm::FixedWindow,
    Algorithm::SlidingLog,
    Algorithm::SlidingWindow,
    Algorithm::SubWindow,
];

/// One admission an hour under `algorithm`.
fn one_per_hour(algorithm: Algorithm) -> Limit {
    Limit::per_hour(1).algorithm(algorithm).build().unwrap()
}

/// A small deterministic generator (no dependency): xorshift64*.
struct Xorshift(u64);

impl Xorshift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

#[test]
fn splits_of_the_same_bytes_between_scope_and_key_keep_states_apart() {
    let store = MemoryStore::builder().clock(Arc::new(ManualClock::new(T0))).build();
    let mut random = Xorshift(0x9e37_79b9_7f4a_7c15);
    for round in 0..200 {
        // Bytes from a tiny alphabet (ASCII: every split is a valid scope), 0 to 40 long.
        let len = usize::try_from(random.next() % 41).unwrap();
        let bytes: String = (0..len).map(|_| char::from(b'a' + u8::try_from(random.next() % 3).unwrap())).collect();
        let algorithm = ALGORITHMS[usize::try_from(random.next() % 7).unwrap()];
        let limit = one_per_hour(algorithm);
        // Every split of the same bytes: each its own state, so each admitted once, then refused.
        for split in 0..=len {
            let (scope, key) = bytes.split_at(split);
            let scope = format!("r{round}-{scope}");
            let check = Check::new(key.as_bytes(), &limit, 1).scoped(&scope);
            assert!(
                store.check_one_sync(check).unwrap().allowed,
                "round {round} {algorithm:?}: scope {scope:?} key {key:?} found another split's state"
            );
        }
        for split in 0..=len {
            let (scope, key) = bytes.split_at(split);
            let scope = format!("r{round}-{scope}");
            let check = Check::new(key.as_bytes(), &limit, 1).scoped(&scope);
            assert!(!store.check_one_sync(check).unwrap().allowed, "round {round}: {scope:?} {key:?} not counted");
        }
    }
}

#[test]
fn an_empty_scope_and_every_algorithm_keep_states_apart() {
    let store = MemoryStore::builder().clock(Arc::new(ManualClock::new(T0))).build();
    // ("", "ab"), ("a", "b"), ("ab", ""): the same bytes; and the ad-hoc check (empty scope).
    for algorithm in ALGORITHMS {
        let limit = one_per_hour(algorithm);
        assert!(store.check_sync(b"ab", &limit, 1).unwrap().allowed, "{algorithm:?}: ad-hoc key ab");
        for (scope, key) in [("a", "b"), ("ab", ""), ("", "ab")] {
            let decision = store.check_one_sync(Check::new(key.as_bytes(), &limit, 1).scoped(scope)).unwrap();
            // The empty scope is the ad-hoc check's: the one state already counted.
            assert_eq!(decision.allowed, !scope.is_empty(), "{algorithm:?}: scope {scope:?} key {key:?}");
        }
    }
    // Seven algorithms, one key: each admitted once under its own state (above), none left now.
    for algorithm in ALGORITHMS {
        assert!(!store.check_sync(b"ab", &one_per_hour(algorithm), 1).unwrap().allowed, "{algorithm:?}");
    }
}
