//! Rules with `count_status`, at the engine: the request's cost is *reserved* at admission (so at
//! most `count` requests are ever in flight or counted), kept when the response's status is one
//! the rule counts and refunded otherwise ([`Engine::complete`]); each reservation in its own
//! rule, once, under the rules it was admitted with. A refund never over-grants: after the window
//! it was counted in has moved on, or after another admission on a bucket, it gives back nothing.
//! A dry-run rule's reservation is settled too; a caller naming a rule (no response status) keeps
//! what it counted.
//!
//! [`Engine::complete`]: tollgate_engine::Engine::complete

mod support;

use support::{SEC, get, harness, post, secs};
use tollgate_engine::{Admission, Answer, Frontend};
use tollgate_rules::Rules;

const FAILURES: &str = "[[rules]]\nname = \"failures\"\nlimit = \"3/1m\"\nalgorithm = \"fixed-window\"\n\
     key = [\"client_ip\"]\ncount_status = [401, 403]\nmatch = { method = \"POST\", path = \"/login\" }\n";

/// Reserved before the response, refunded after one the rule does not count, kept after one it
/// counts; reservations in flight count toward the limit.
#[tokio::test]
async fn a_reservation_is_kept_for_the_statuses_counted_and_refunded_for_the_others() {
    let h = harness(FAILURES);
    let login = post("/login");
    let ip = "192.0.2.1";

    let proceed = h.proceed(&login).await;
    assert!(!proceed.pending.is_empty(), "a count_status rule reserves");
    assert_eq!(h.remaining("failures", ip).await, 2, "reserved while the request runs");
    h.engine.complete(proceed.pending, 200).await;
    assert_eq!(h.remaining("failures", ip).await, 3, "200 is not counted: refunded");

    for status in [401, 403] {
        let proceed = h.proceed(&login).await;
        h.engine.complete(proceed.pending, status).await;
    }
    assert_eq!(h.remaining("failures", ip).await, 1, "401 and 403 are counted");
    assert_eq!((h.counted("failures", "counted"), h.counted("failures", "refunded")), (2, 1));

    // One more in flight reaches the limit: the next is refused before any response is known.
    let in_flight = h.proceed(&login).await;
    assert_eq!(h.outcome(&login).await, "429:failures");
    h.engine.complete(in_flight.pending, 500).await;
    assert_eq!(h.remaining("failures", ip).await, 1, "its 500 was refunded");
    let proceed = h.proceed(&login).await;
    h.engine.complete(proceed.pending, 401).await;
    assert_eq!(h.outcome(&login).await, "429:failures");
    assert_eq!(h.counted("failures", "allowed"), 5);
}

/// At most `count` requests get through at once, whatever their responses will be; once their
/// statuses are known (none counted), the whole budget is back.
#[tokio::test]
async fn at_most_count_requests_are_in_flight() {
    let h = harness(
        "[[rules]]\nname = \"failures\"\nlimit = \"5/1m\"\nalgorithm = \"sliding-log\"\nkey = [\"client_ip\"]\n\
         count_status = [401]\n",
    );
    let mut in_flight = Vec::new();
    let mut refused = 0;
    for _ in 0..40 {
        match h.admit(&post("/login")).await {
            tollgate_engine::Admission::Proceed(proceed) => in_flight.push(proceed),
            _ => refused += 1,
        }
    }
    assert_eq!((in_flight.len(), refused), (5, 35));
    for proceed in in_flight {
        h.engine.complete(proceed.pending, 200).await;
    }
    assert_eq!(h.remaining("failures", "192.0.2.1").await, 5);
}

/// A refund gives back only where the reservation was counted, if it is still there: not the
/// next fixed window's budget, not a sliding log's entry that left, not a bucket's schedule
/// another admission extended since (the reservation then stays counted: an under-grant).
#[tokio::test]
async fn a_refund_never_over_grants() {
    for algorithm in ["fixed-window", "sliding-log"] {
        let h = harness(&format!(
            "[[rules]]\nname = \"r\"\nlimit = \"2/1m\"\nalgorithm = \"{algorithm}\"\nkey = [\"global\"]\ncount_status = [401]\n"
        ));
        h.advance(secs(10));
        let early = h.proceed(&post("/")).await;
        h.advance(secs(65));
        let (b, c) = (h.proceed(&post("/")).await, h.proceed(&post("/")).await);
        h.engine.complete(early.pending, 200).await;
        assert_eq!(h.remaining("r", "").await, 0, "{algorithm}: the early reservation left the window");
        assert_eq!(h.outcome(&post("/")).await, "429:r", "{algorithm}");
        h.engine.complete(b.pending, 200).await;
        assert_eq!(h.remaining("r", "").await, 1, "{algorithm}: one in the window, given back");
        h.engine.complete(c.pending, 401).await;
        assert_eq!(h.remaining("r", "").await, 1, "{algorithm}");
    }
    for algorithm in ["gcra", "token-bucket", "leaky-bucket"] {
        let h = harness(&format!(
            "[[rules]]\nname = \"r\"\nlimit = \"3/1m\"\nalgorithm = \"{algorithm}\"\nkey = [\"global\"]\ncount_status = [401]\n"
        ));
        let (a, b) = (h.proceed(&post("/")).await, h.proceed(&post("/")).await);
        h.engine.complete(a.pending, 200).await;
        assert_eq!(h.remaining("r", "").await, 1, "{algorithm}: b was admitted since a: a stays counted");
        h.engine.complete(b.pending, 200).await;
        assert_eq!(h.remaining("r", "").await, 2, "{algorithm}: b was the last admission: given back exactly");
    }
}

/// A request counted by two `count_status` rules (each counting other statuses) and a plain one:
/// each reservation is settled in its own rule, at its own admission, once.
#[tokio::test]
async fn each_rule_settles_its_own_reservation_once() {
    let h = harness(
        "[[rules]]\nname = \"failures\"\nlimit = \"3/1m\"\nalgorithm = \"fixed-window\"\nkey = [\"client_ip\"]\n\
         count_status = [401]\n\
         [[rules]]\nname = \"errors\"\nlimit = \"4/1m\"\nkey = [\"global\"]\ncount_status = [500, 503]\n\
         [[rules]]\nname = \"all\"\nlimit = \"10/1m\"\nalgorithm = \"sliding-log\"\nkey = [\"global\"]\n",
    );
    let state = async || {
        (h.remaining("failures", "192.0.2.1").await, h.remaining("errors", "").await, h.remaining("all", "").await)
    };
    let proceed = h.proceed(&post("/")).await;
    assert_eq!(state().await, (2, 3, 9), "reserved on both, charged on the plain rule");
    h.engine.complete(proceed.pending, 401).await;
    assert_eq!(state().await, (2, 4, 9), "401: failures keeps it, errors gives it back");
    let proceed = h.proceed(&post("/")).await;
    h.engine.complete(proceed.pending, 503).await;
    assert_eq!(state().await, (2, 3, 8), "503: errors keeps it, failures gives it back");

    let (a, b) = (h.proceed(&post("/")).await, h.proceed(&post("/")).await);
    assert_eq!(state().await, (0, 1, 6));
    h.engine.complete(b.pending, 200).await;
    assert_eq!(state().await, (1, 2, 6), "one refund each: not two");
    h.engine.complete(a.pending, 200).await;
    assert_eq!(state().await, (2, 3, 6));
    assert_eq!((h.counted("failures", "refunded"), h.counted("errors", "refunded")), (3, 3));
}

/// Rules reloaded between a request's admission and its response: the reservation settles under
/// the rules it was made under (which did not count 200), the next request under the new ones.
#[tokio::test]
async fn a_reservation_settles_under_the_rules_it_was_admitted_with() {
    let h = harness(FAILURES);
    let rules = |statuses: &str| {
        Rules::parse(&FAILURES.replace("count_status = [401, 403]", &format!("count_status = [{statuses}]")), "t")
            .unwrap()
    };
    let before = h.proceed(&post("/login")).await;
    h.engine.reload(rules("200"));
    h.engine.complete(before.pending, 200).await;
    assert_eq!(h.remaining("failures", "192.0.2.1").await, 3, "refunded: the old rules do not count 200");
    let after = h.proceed(&post("/login")).await;
    h.engine.complete(after.pending, 200).await;
    assert_eq!(h.remaining("failures", "192.0.2.1").await, 2, "kept: the new rules count 200");
}

/// A dry-run rule's reservation is settled with the enforced ones' (refunded for a status it does
/// not count); a request whose response never comes (its reservations dropped) stays counted.
#[tokio::test]
async fn dry_run_reservations_are_settled_and_dropped_ones_stay_counted() {
    let h = harness(
        "[[rules]]\nname = \"trial\"\nlimit = \"2/1m\"\nalgorithm = \"fixed-window\"\nkey = [\"global\"]\n\
         count_status = [401]\n[rules.mitigation]\naction = \"dry-run\"\n\
         [[rules]]\nname = \"per-ip\"\nlimit = \"5/1m\"\nkey = [\"client_ip\"]\ncount_status = [401]\n",
    );
    let state = async || (h.remaining("trial", "").await, h.remaining("per-ip", "192.0.2.1").await);
    let proceed = h.proceed(&post("/")).await;
    assert_eq!(state().await, (1, 4));
    h.engine.complete(proceed.pending, 200).await;
    assert_eq!(state().await, (2, 5), "both refunded");
    drop(h.proceed(&post("/")).await);
    assert_eq!(state().await, (1, 4), "never settled: an under-grant, never an over-grant");
    assert_eq!((h.counted("trial", "refunded"), h.counted("per-ip", "refunded")), (1, 1));
}

/// `TG.LIMIT` / `limit_name` on a `count_status` rule: the caller has no response status, so what
/// it reserved stays counted; a peek counts nothing.
#[tokio::test]
async fn a_caller_naming_a_count_status_rule_keeps_what_it_counted() {
    let h = harness(
        "[[rules]]\nname = \"named\"\nlimit = \"2/1m\"\nalgorithm = \"fixed-window\"\nkey = [\"key\"]\ncount_status = [401]\n",
    );
    let check = |cost| h.engine.check_named(Frontend::Resp, "named", b"k", cost);
    let (peek, _) = check(0).await.unwrap();
    assert_eq!((peek.allowed, peek.remaining), (true, 2));
    let answers = [check(1).await.unwrap().0, check(1).await.unwrap().0, check(1).await.unwrap().0];
    let got: Vec<(bool, u64)> = answers.iter().map(|d| (d.allowed, d.remaining)).collect();
    assert_eq!(got, [(true, 1), (true, 0), (false, 0)]);
    assert_eq!(answers[2].retry_after_ns, 60 * SEC, "until the window ends");
    assert_eq!(h.remaining("named", "k").await, 0);
    assert_eq!((h.counted("named", "counted"), h.counted("named", "refunded")), (2, 0));
}

/// `count_status = [401]` with a lockout (`timeout`, every request of the key): what only the
/// reservations in flight refuse is not over the limit.
const LOCKOUT: &str = "[[rules]]\nname = \"lock\"\nlimit = \"2/1m\"\nalgorithm = \"sliding-log\"\n\
     key = [\"client_ip\"]\ncount_status = [401]\nmatch = { method = \"POST\", path = \"/login\" }\n\
     [rules.mitigation]\nmatch = {}\ntimeout = \"60s\"\n";

/// Before: a request refused only because other requests were still in flight (their statuses
/// unknown) went "over": it held the key for the rule's timeout (every request of it refused for
/// 60 s) though no counted status had been seen. Now it is refused on its own, to retry in a
/// second, and nothing is held; the key is held once the statuses counted reach the limit.
#[tokio::test]
async fn what_only_reservations_in_flight_refuse_holds_nothing() {
    let h = harness(LOCKOUT);
    let login = post("/login");
    let (a, b) = (h.proceed(&login).await, h.proceed(&login).await);
    match h.admit(&login).await {
        Admission::Answer(Answer::TooMany(fields)) => {
            assert_eq!(fields.decision.retry_after_ns, SEC, "retry once those in flight are answered");
        }
        other => panic!("{}", support::describe(&other)),
    }
    assert_eq!(h.outcome(&get("/")).await, "proceed", "nothing held");
    h.engine.complete(a.pending, 200).await;
    h.engine.complete(b.pending, 401).await;
    // One failure counted, one request in flight: the next is refused, still not over.
    let c = h.proceed(&login).await;
    assert_eq!(h.outcome(&login).await, "429:lock");
    assert_eq!(h.outcome(&get("/")).await, "proceed", "one failure counted: not over");
    h.engine.complete(c.pending, 401).await;
    // Two failures counted: over, and held for the timeout.
    assert_eq!(h.outcome(&login).await, "429:lock");
    assert_eq!(h.outcome(&get("/")).await, "429:lock", "held");
    h.advance(secs(61));
    assert_eq!(h.outcome(&get("/")).await, "proceed");
    assert_eq!((h.counted("lock", "counted"), h.counted("lock", "refunded")), (2, 1));
}
