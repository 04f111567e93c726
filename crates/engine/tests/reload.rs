//! Reloading the rules at the engine: a rule that keeps its name keeps its keys' counts, also when
//! its algorithm changes (each key's use is carried into the new algorithm's state on its first
//! request after the reload, never more than the old state had used).

mod support;

use support::{get, harness, secs};
use tollgate_rules::Rules;

const ALGORITHMS: [&str; 7] =
    ["gcra", "token-bucket", "leaky-bucket", "fixed-window", "sliding-log", "sliding-window", "sub-window"];

/// The rule `lock`: 3 per hour per client, under `algorithm`.
fn lock(algorithm: &str) -> String {
    format!("[[rules]]\nname = \"lock\"\nlimit = \"3/1h\"\nalgorithm = \"{algorithm}\"\nkey = [\"client_ip\"]\n")
}

/// Before: state was found by (rule, algorithm, key), so `lock` at 3/1h, spent (1, 1, 1, 0) and
/// reloaded as a fixed window admitted 1, 1, 1, 0 again. Now every pair of algorithms keeps the
/// count: two spent before the reload leave one after it.
#[tokio::test]
async fn a_rule_that_changes_its_algorithm_keeps_its_counts() {
    for from in ALGORITHMS {
        for to in ALGORITHMS.iter().filter(|&&to| to != from) {
            let h = harness(&lock(from));
            let (a, b) = (get("/").from("192.0.2.1"), get("/").from("192.0.2.2"));
            assert_eq!(h.outcomes(&a, 2).await, ["proceed", "proceed"], "{from}");
            assert_eq!(h.outcomes(&b, 3).await, ["proceed", "proceed", "proceed"], "{from}");
            h.engine.reload(Rules::parse(&lock(to), "t").unwrap());
            assert_eq!(h.outcomes(&a, 2).await, ["proceed", "429:lock"], "{from} -> {to}: 2 spent before");
            assert_eq!(h.outcomes(&b, 1).await, ["429:lock"], "{from} -> {to}: 3 spent before");
            let fresh = get("/").from("192.0.2.3");
            assert_eq!(h.outcomes(&fresh, 4).await, ["proceed", "proceed", "proceed", "429:lock"], "{from} -> {to}");
        }
    }
}

/// The count carried is what the old state had used at the first request after the reload: a
/// bucket that drained meanwhile carries less; reloaded again, the count follows the rule.
#[tokio::test]
async fn what_is_carried_is_what_the_old_state_used_then() {
    let h = harness(&lock("gcra"));
    let a = get("/").from("192.0.2.1");
    assert_eq!(h.outcomes(&a, 3).await, ["proceed", "proceed", "proceed"]);
    // One slot of 20 min has drained.
    h.advance(secs(20 * 60));
    h.engine.reload(Rules::parse(&lock("sliding-log"), "t").unwrap());
    assert_eq!(h.outcomes(&a, 1).await, ["proceed"], "two carried, one used since");
    h.engine.reload(Rules::parse(&lock("fixed-window"), "t").unwrap());
    assert_eq!(h.outcomes(&a, 1).await, ["429:lock"], "three carried on");
}

/// Two reloads in a row, through every chain of algorithms (back to the first one too): a key
/// carried under the second rules is carried on from there, one nobody asked for meanwhile is
/// carried from its first state, and neither is counted twice nor forgotten.
#[tokio::test]
async fn reloads_back_and_forth_carry_each_key_once() {
    for a in ALGORITHMS {
        for b in ALGORITHMS.iter().filter(|&&b| b != a) {
            for c in ALGORITHMS {
                let h = harness(&lock(a));
                let (x, y) = (get("/").from("192.0.2.1"), get("/").from("192.0.2.2"));
                assert_eq!(h.outcomes(&x, 2).await, ["proceed", "proceed"]);
                assert_eq!(h.outcomes(&y, 2).await, ["proceed", "proceed"]);
                h.advance(secs(1));
                h.engine.reload(Rules::parse(&lock(b), "t").unwrap());
                // x is touched under b (carried, one more used); y is not.
                assert_eq!(h.outcomes(&x, 1).await, ["proceed"], "{a}->{b}");
                h.advance(secs(1));
                h.engine.reload(Rules::parse(&lock(c), "t").unwrap());
                assert_eq!(h.outcomes(&x, 1).await, ["429:lock"], "{a}->{b}->{c}: x used 3");
                assert_eq!(h.outcomes(&y, 2).await, ["proceed", "429:lock"], "{a}->{b}->{c}: y used 2");
            }
        }
    }
}
