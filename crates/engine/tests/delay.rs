//! The `delay` mitigation at the engine: a shaper (the rule's bucket widened by `max_delay`) that
//! admits a request within the delay and tells the front end how long to hold it (its GCRA slot,
//! one emission interval after the last), on each bucket algorithm; refuses beyond `max_delay`
//! (default `burst × T`); takes a slot only when the request is admitted by every rule; holds a
//! refused key for its `timeout`; and makes a caller naming the rule wait for its slot.

mod support;

use std::time::Duration;

use support::{get, harness, ms, secs};
use tollgate_engine::{Admission, Frontend};
use tollgate_rules::Rules;

/// The delay each of `n` requests sent at once is told, or `429:RULE` once refused.
async fn delays(h: &support::Harness, req: &support::Req, n: usize) -> Vec<String> {
    let mut got = Vec::new();
    for _ in 0..n {
        got.push(match h.admit(req).await {
            Admission::Proceed(proceed) => format!("{}ms", proceed.delay.as_millis()),
            other => support::describe(&other),
        });
    }
    got
}

fn shaper(algorithm: &str, burst: u64, max_delay: Option<&str>, more: &str) -> String {
    let max_delay = max_delay.map(|d| format!("max_delay = \"{d}\"\n")).unwrap_or_default();
    format!(
        "[[rules]]\nname = \"shape\"\nlimit = \"10/s\"\nalgorithm = \"{algorithm}\"\nburst = {burst}\nkey = [\"global\"]\n\
         [rules.mitigation]\naction = \"delay\"\n{max_delay}{more}"
    )
}

/// 10/s with a burst of 1 and `max_delay = "300ms"`: a burst of requests is told 0, 100, 200 and
/// 300 ms, the next is refused (400 ms is beyond the delay); 100 ms later a slot has passed: the
/// next waits 300 ms. The same on each algorithm of the bucket family.
#[tokio::test]
async fn delay_holds_each_request_until_its_slot_on_every_bucket() {
    for algorithm in ["gcra", "token-bucket", "leaky-bucket"] {
        let h = harness(&shaper(algorithm, 1, Some("300ms"), ""));
        assert_eq!(delays(&h, &get("/"), 5).await, ["0ms", "100ms", "200ms", "300ms", "429:shape"], "{algorithm}");
        h.advance(ms(100));
        assert_eq!(delays(&h, &get("/"), 2).await, ["300ms", "429:shape"], "{algorithm}");
        h.advance(secs(1));
        assert_eq!(delays(&h, &get("/"), 1).await, ["0ms"], "{algorithm}: idle again");
        let counts = [h.counted("shape", "allowed"), h.counted("shape", "delayed"), h.counted("shape", "rejected")];
        assert_eq!(counts, [2, 4, 2], "{algorithm}: allowed, delayed, rejected");
    }
}

/// Without `max_delay`, a request may wait up to the burst's worth of slots (`burst × T`).
#[tokio::test]
async fn the_default_max_delay_is_the_burst() {
    let h = harness(&shaper("gcra", 2, None, ""));
    assert_eq!(delays(&h, &get("/"), 5).await, ["0ms", "0ms", "100ms", "200ms", "429:shape"]);
}

/// A request refused by another rule takes no slot (all or nothing): the next admitted request is
/// told the slot after the last admitted one.
#[tokio::test]
async fn a_delay_slot_is_taken_only_by_an_admitted_request() {
    let h = harness(&shaper(
        "gcra",
        1,
        Some("1s"),
        "[[rules]]\nname = \"per-ip\"\nlimit = \"2/1m\"\nalgorithm = \"fixed-window\"\nkey = [\"client_ip\"]\n",
    ));
    let a = get("/").from("192.0.2.1");
    assert_eq!(delays(&h, &a, 4).await, ["0ms", "100ms", "429:per-ip", "429:per-ip"]);
    assert_eq!(delays(&h, &get("/").from("192.0.2.2"), 1).await, ["200ms"]);
}

/// A key refused beyond `max_delay` under a rule with a `timeout` is held for it: no slot is
/// given until it ends, though slots free up meanwhile.
#[tokio::test]
async fn a_refused_key_is_held_for_the_timeout() {
    let h = harness(&shaper("leaky-bucket", 1, Some("100ms"), "timeout = \"1s\"\n"));
    assert_eq!(delays(&h, &get("/"), 3).await, ["0ms", "100ms", "429:shape"]);
    h.advance(ms(500));
    assert_eq!(delays(&h, &get("/"), 1).await, ["429:shape"], "held, though a slot is free");
    h.advance(ms(500));
    assert_eq!(delays(&h, &get("/"), 1).await, ["0ms"]);
}

/// A caller naming a delay rule is answered admitted once its slot has come: the reply waits
/// (tokio's paused clock: virtual, exact); beyond the delay, denied at once.
#[tokio::test(start_paused = true)]
async fn a_caller_naming_a_delay_rule_waits_for_its_slot() {
    let h = harness(
        "[[rules]]\nname = \"shape\"\nlimit = \"10/s\"\nburst = 1\nkey = [\"key\"]\n\
         [rules.mitigation]\naction = \"delay\"\nmax_delay = \"100ms\"\n",
    );
    let mut answers = Vec::new();
    for _ in 0..3 {
        let started = tokio::time::Instant::now();
        let (decision, _) = h.engine.check_named(Frontend::Resp, "shape", b"k", 1).await.unwrap();
        answers.push((decision.allowed, started.elapsed()));
    }
    assert_eq!(answers, [(true, Duration::ZERO), (true, ms(100)), (false, Duration::ZERO)]);
}

/// Before: a `max_delay` widening the shaper past the longest period a limit may have (50 days)
/// was dropped without a word, and the rule delayed nothing. Now the file is refused, saying why.
#[test]
fn a_max_delay_that_cannot_be_honoured_is_refused_at_load() {
    let error = Rules::parse(&shaper("gcra", 1, Some("60d"), ""), "t").map(|_| ()).unwrap_err().to_string();
    assert!(error.contains("rule \"shape\": max_delay 60d"), "{error}");
    assert!(Rules::parse(&shaper("gcra", 1, Some("49d"), ""), "t").is_ok());
}

/// A front end's request time bounds every wait (`EngineBuilder::max_wait`: `tollgate serve`
/// gives its HTTP request timeout): a caller naming a delay rule whose slot would come later is
/// denied at once, charging nothing (the next caller gets the same slot).
#[tokio::test(start_paused = true)]
async fn a_wait_never_outlasts_the_front_ends_request_time() {
    let rules = shaper("gcra", 1, Some("1s"), "").replace("\"global\"", "\"key\"");
    let h = support::tuned(&rules, |builder| builder.max_wait(ms(250)));
    let mut answers = Vec::new();
    for _ in 0..4 {
        let started = tokio::time::Instant::now();
        let (decision, _) = h.engine.check_named(Frontend::Resp, "shape", b"k", 1).await.unwrap();
        answers.push((decision.allowed, started.elapsed()));
    }
    let waited = [(true, Duration::ZERO), (true, ms(100)), (true, ms(200)), (false, Duration::ZERO)];
    assert_eq!(answers, waited, "a 300 ms wait is past the 250 ms a request has");
    h.advance(ms(100));
    let (decision, _) = h.engine.check_named(Frontend::Resp, "shape", b"k", 1).await.unwrap();
    assert!(decision.allowed, "the refusal charged nothing: a slot 200 ms away again");
}

/// A request refused only because too many requests wait already (across keys) is not over its
/// limit: its key is not held for the rule's timeout, and once a slot needs no wait it passes.
#[tokio::test]
async fn a_request_refused_for_want_of_a_place_holds_nothing() {
    let rules = "[[rules]]\nname = \"shape\"\nlimit = \"10/s\"\nburst = 1\nkey = [\"client_ip\"]\n\
                 [rules.mitigation]\naction = \"delay\"\nmax_delay = \"1s\"\ntimeout = \"10s\"\n";
    let h = support::tuned(rules, |builder| builder.max_delayed(1));
    let (a, b) = (get("/").from("192.0.2.1"), get("/").from("192.0.2.2"));
    let first = h.proceed(&a).await;
    let waiting = h.proceed(&a).await;
    assert_eq!((first.delay, waiting.delay), (Duration::ZERO, ms(100)), "the only place is taken");
    assert_eq!(delays(&h, &b, 2).await, ["0ms", "429:shape"], "no wait needs no place; a wait does");
    h.advance(ms(100));
    assert_eq!(delays(&h, &b, 1).await, ["0ms"], "not held for the timeout: its slot came");
    drop(waiting);
    assert_eq!(delays(&h, &b, 1).await, ["100ms"], "the place is free again");
}
