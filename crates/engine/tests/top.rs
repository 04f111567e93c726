//! The measured rates at the engine, on the manual clock: [`Engine::top`] ranks a rule's keys by
//! rate (highest first, at most `n`, at most [`MAX_TOP`]), measured over every request the rule
//! matches whatever is decided for it (refused, held by a timeout, refunded), and says which keys
//! are limited (over the limit, held, until when); a 429 carries the key's rate. Dry-run rules
//! count a request only when it is charged: quarantined, yes; held by another rule's timeout or
//! refused as a bad request, no (the enforced-refusal case is `measured.rs`'s).
//!
//! [`Engine::top`]: tollgate_engine::Engine::top

mod support;

use std::time::Duration;

use support::{MS, get, harness, ms, routing, secs};
use tollgate_engine::{Admission, Answer, MAX_TOP};

/// Four addresses sending 20, 10, 5 and 1 per second for five seconds (half-life 1 s).
async fn four_senders(h: &support::Harness) {
    for tick in 0..100u64 {
        for (ip, every) in [("192.0.2.20", 1), ("192.0.2.10", 2), ("192.0.2.5", 4), ("192.0.2.1", 20)] {
            if tick % every == 0 {
                assert_eq!(h.outcome(&get("/").from(ip)).await, "proceed");
            }
        }
        h.advance(ms(50));
    }
}

#[tokio::test]
async fn top_ranks_a_rules_keys_by_their_measured_rate() {
    let h = harness(
        "[[rules]]\nname = \"m\"\nlimit = \"1000/1m\"\nkey = [\"client_ip\"]\nrate_half_life = \"1s\"\n\
         [[rules]]\nname = \"other\"\nlimit = \"1000/1m\"\nkey = [\"global\"]\nrate_half_life = \"1s\"\n",
    );
    four_senders(&h).await;
    let top = h.engine.top("m", 3).unwrap();
    let keys: Vec<&str> = top.iter().map(|t| t.key.as_str()).collect();
    assert_eq!(keys, ["192.0.2.20", "192.0.2.10", "192.0.2.5"], "highest first, at most n");
    for (talker, rate) in top.iter().zip([20.0, 10.0, 5.0]) {
        assert!((talker.rate_per_s - rate).abs() <= rate / 10.0, "{talker:?} sends {rate}/s");
        assert!(!talker.limited, "{talker:?}");
    }
    assert_eq!(h.engine.top("m", 10).unwrap().len(), 4);
    let other = h.engine.top("other", 10).unwrap();
    assert_eq!(other.len(), 1, "each rule its own keys: {other:?}");
    assert!((other[0].rate_per_s - 36.0).abs() <= 3.6, "{other:?}");

    // A second later, without a request, every rate has halved.
    h.advance(secs(1));
    let later = h.engine.top("m", 1).unwrap();
    assert!((later[0].rate_per_s - top[0].rate_per_s / 2.0).abs() <= 0.5, "{later:?} after {top:?}");

    for i in 0..150u8 {
        h.outcome(&get("/").from(&format!("198.51.100.{i}"))).await;
    }
    assert_eq!(h.engine.top("m", 1_000).unwrap().len(), MAX_TOP);
}

/// The rate counts every request the rule matches: refused by its limit, held by its timeout, or
/// admitted then refunded (`count_status`); 10/s reads 10/s, though the rule admitted 2. The
/// 429s carry it; a rule that is not measured carries none.
#[tokio::test]
async fn the_rate_counts_every_request_whatever_is_decided_for_it() {
    let h = harness(
        "[[rules]]\nname = \"held\"\nlimit = \"2/1m\"\nalgorithm = \"fixed-window\"\nkey = [\"client_ip\"]\n\
         rate_half_life = \"1s\"\nmatch = { path = \"/held\" }\n[rules.mitigation]\ntimeout = \"10s\"\n\
         [[rules]]\nname = \"refunded\"\nlimit = \"2/1m\"\nkey = [\"client_ip\"]\ncount_status = [401]\n\
         rate_half_life = \"1s\"\nmatch = { path = \"/refunded\" }\n\
         [[rules]]\nname = \"plain\"\nlimit = \"1/1m\"\nkey = [\"client_ip\"]\nmatch = { path = \"/plain\" }\n",
    );
    let mut last_rate = None;
    for _ in 0..30 {
        if let Admission::Answer(Answer::TooMany(fields)) = h.admit(&get("/held")).await {
            last_rate = fields.rate_per_s;
        }
        let proceed = h.proceed(&get("/refunded")).await;
        h.engine.complete(proceed.pending, 200).await;
        h.advance(ms(100));
    }
    assert_eq!((h.counted("held", "allowed"), h.counted("held", "rejected")), (2, 28));
    for rule in ["held", "refunded"] {
        let rate = h.engine.top(rule, 1).unwrap()[0].rate_per_s;
        assert!((rate - 10.0).abs() <= 1.0, "{rule}: {rate}/s");
    }
    let reported = last_rate.expect("a measured rule's 429 carries the rate");
    assert!((reported - 10.0).abs() <= 1.0, "{reported}");

    assert_eq!(h.outcome(&get("/plain")).await, "proceed");
    let Admission::Answer(Answer::TooMany(fields)) = h.admit(&get("/plain")).await else { panic!("over") };
    assert_eq!(fields.rate_per_s, None, "not measured");
}

/// `limited` is true while the key is over its limit (until the limit admits it again), or held
/// by the rule's timeout (until the timeout ends); false for a key under its limit.
#[tokio::test]
async fn top_says_which_keys_are_limited_until_when() {
    let h = harness(
        "[[rules]]\nname = \"window\"\nlimit = \"2/1m\"\nalgorithm = \"fixed-window\"\nkey = [\"client_ip\"]\n\
         rate_half_life = \"10s\"\nmatch = { path = \"/w\" }\n\
         [[rules]]\nname = \"timeout\"\nlimit = \"2/1m\"\nalgorithm = \"fixed-window\"\nkey = [\"client_ip\"]\n\
         rate_half_life = \"10s\"\nmatch = { path = \"/t\" }\n[rules.mitigation]\ntimeout = \"2m\"\n",
    );
    let limited = |rule: &str| {
        let mut top = h.engine.top(rule, 10).unwrap();
        top.sort_by(|a, b| a.key.cmp(&b.key));
        top.into_iter().map(|t| (t.key, t.limited)).collect::<Vec<_>>()
    };
    let pair = |a: bool, b: bool| vec![("192.0.2.1".to_string(), a), ("192.0.2.2".to_string(), b)];
    for (path, rule) in [("/w", "window"), ("/t", "timeout")] {
        assert_eq!(h.outcomes(&get(path), 3).await[2], format!("429:{rule}"));
        assert_eq!(h.outcome(&get(path).from("192.0.2.2")).await, "proceed");
    }
    assert_eq!(limited("window"), pair(true, false));
    assert_eq!(limited("timeout"), pair(true, false));
    h.advance(Duration::from_nanos(60_000 * MS - 1));
    assert_eq!((limited("window"), limited("timeout")), (pair(true, false), pair(true, false)));
    h.advance(Duration::from_nanos(1));
    assert_eq!(limited("window"), pair(false, false), "its window admits again");
    assert_eq!(limited("timeout"), pair(true, false), "held for the timeout");
    h.advance(secs(60));
    assert_eq!(limited("timeout"), pair(false, false));
}

/// A dry-run rule counts what the enforced rules charge: a quarantined request (charged to every
/// other rule), yes; one answered by another rule's timeout, or a bad request, no.
#[tokio::test]
async fn a_dry_run_rule_counts_quarantined_requests_but_not_held_or_bad_ones() {
    let h = routing(
        "[[rules]]\nname = \"trial\"\nlimit = \"10/1m\"\nalgorithm = \"fixed-window\"\nkey = [\"global\"]\n\
         [rules.mitigation]\naction = \"dry-run\"\n\
         [[rules]]\nname = \"quarantine\"\nlimit = \"1/1m\"\nkey = [\"global\"]\nmatch = { path = \"/q\" }\n\
         [rules.mitigation]\naction = \"route\"\nupstream = \"http://127.0.0.1:3001\"\n\
         [[rules]]\nname = \"per-ip\"\nlimit = \"100/1m\"\nkey = [\"client_ip\"]\nmatch = { path = \"/q\" }\n\
         [[rules]]\nname = \"held\"\nlimit = \"1/1m\"\nkey = [\"client_ip\"]\nmatch = { path = \"/h\" }\n\
         [rules.mitigation]\ntimeout = \"5m\"\n\
         [[rules]]\nname = \"costly\"\nlimit = \"5/1m\"\nkey = [\"global\"]\ncost_header = \"x-cost\"\nmatch = { path = \"/c\" }\n",
    );
    assert_eq!(h.outcomes(&get("/q"), 2).await, ["proceed", "route:quarantine"]);
    assert_eq!(h.remaining("trial", "").await, 8, "the quarantined request counts");
    assert_eq!(h.remaining("per-ip", "192.0.2.1").await, 98, "as on every other rule");
    assert_eq!(h.outcomes(&get("/h"), 3).await, ["proceed", "429:held", "429:held"]);
    assert_eq!(h.outcome(&get("/c").header("x-cost", "many")).await, "400");
    assert_eq!(h.remaining("trial", "").await, 7, "refused, held or bad: not counted");
    assert_eq!(h.counted("trial", "allowed"), 3);
}
