//! Mitigation at the engine, separate from counting: once a key goes over, its rule's action
//! answers it (`reject`: 429; `shadow-ban`: the configured fake success; `route`: the quarantine,
//! still charged to the other rules; `dry-run`: admitted, counted `dry_run`) for the rule's
//! `timeout` after it went over (or until the limit admits again, whichever is later; without a
//! timeout, while it is over), for every request its `mitigation.match` selects; a mitigated
//! request consumes nothing anywhere. Each test advances the manual clock to where the mitigation
//! ends. `when_rate_above` mitigates by the measured rate, and holds the key for the timeout too.

mod support;

use support::{SEC, get, harness, post, routing, secs};
use tollgate_core::Clock;
use tollgate_engine::{Admission, Answer, Fields, Frontend};

/// The fields of a request answered 429.
async fn rejected<S: tollgate_store::Store>(h: &support::Harness<S>, req: &support::Req) -> Fields {
    match h.admit(req).await {
        Admission::Answer(Answer::TooMany(fields)) => fields,
        other => panic!("not a 429: {}", support::describe(&other)),
    }
}

/// `reject` with `timeout = "5m"` on a 2/1m window: the key is answered 429 for five minutes
/// after it went over, told so exactly, though its window admits again after one; nothing is
/// charged meanwhile, anywhere; exactly at the end, it is admitted.
#[tokio::test]
async fn reject_holds_the_key_for_its_timeout_then_lets_it_go() {
    let h = harness(
        "[[rules]]\nname = \"per-ip\"\nlimit = \"2/1m\"\nalgorithm = \"fixed-window\"\nkey = [\"client_ip\"]\n\
         [rules.mitigation]\ntimeout = \"5m\"\n\
         [[rules]]\nname = \"everyone\"\nlimit = \"100/1h\"\nalgorithm = \"fixed-window\"\nkey = [\"global\"]\n",
    );
    let a = get("/").from("192.0.2.1");
    assert_eq!(h.outcomes(&a, 2).await, ["proceed", "proceed"]);
    assert_eq!(h.outcome(&a).await, "429:per-ip", "over: held from now");
    assert_eq!(h.series("tollgate_blocked_keys"), 1);
    assert_eq!(h.outcome(&get("/").from("192.0.2.2")).await, "proceed", "another key is not held");
    let fields = rejected(&h, &a).await;
    assert_eq!((fields.policy.as_str(), fields.decision.retry_after_ns), ("per-ip", 300 * SEC));

    h.advance(secs(60));
    let fields = rejected(&h, &a).await;
    assert_eq!(fields.decision.retry_after_ns, 240 * SEC, "held by the timeout, not by the window");
    assert!(!fields.decision.allowed && fields.decision.remaining == 0);
    h.advance(secs(239));
    assert_eq!(rejected(&h, &a).await.decision.retry_after_ns, SEC);
    assert_eq!(h.remaining("per-ip", "192.0.2.1").await, 2, "held requests charge their rule nothing");
    assert_eq!(h.remaining("everyone", "").await, 97, "nor any other rule");

    h.advance(secs(1));
    assert_eq!(h.outcome(&a).await, "proceed", "the timeout is over");
    assert_eq!((h.counted("per-ip", "rejected"), h.counted("per-ip", "allowed")), (4, 4));
}

/// The request that puts a key over a rule with a `timeout` is told the whole hold (5 min), not
/// the limit's wait (60 s here): a client waiting exactly its Retry-After is not refused again.
/// Every later answer says the same ("keep mitigating this long after the key went over").
#[tokio::test]
async fn the_request_going_over_is_told_the_whole_hold() {
    let h = harness(
        "[[rules]]\nname = \"per-ip\"\nlimit = \"2/1m\"\nalgorithm = \"fixed-window\"\nkey = [\"client_ip\"]\n\
         [rules.mitigation]\ntimeout = \"5m\"\n",
    );
    assert_eq!(h.outcomes(&get("/"), 2).await, ["proceed", "proceed"]);
    assert_eq!(rejected(&h, &get("/")).await.decision.retry_after_ns, 300 * SEC);
}

/// `mitigation.match = {}`: once the login rule went over, every request of that address is
/// answered 429 (not only logins), for the timeout; those requests are not counted by the login
/// rule, and other addresses are untouched. The key is held until its limit would admit it again
/// when that is later than the timeout.
#[tokio::test]
async fn mitigation_match_answers_every_request_of_the_key_without_counting_it() {
    for (timeout, held) in [("60s", 60), ("10s", 30)] {
        let h = harness(&format!(
            "[[rules]]\nname = \"login\"\nlimit = \"2/30s\"\nalgorithm = \"fixed-window\"\nkey = [\"client_ip\"]\n\
             count_status = [401]\nmatch = {{ method = \"POST\", path = \"/login\" }}\n\
             [rules.mitigation]\nmatch = {{}}\ntimeout = \"{timeout}\"\n"
        ));
        for _ in 0..2 {
            let proceed = h.proceed(&post("/login")).await;
            h.engine.complete(proceed.pending, 401).await;
        }
        assert_eq!(h.outcome(&get("/")).await, "proceed", "{timeout}: not over yet, only out of failures");
        assert_eq!(h.outcome(&post("/login")).await, "429:login", "{timeout}: over");
        let fields = rejected(&h, &get("/home")).await;
        assert_eq!(fields.decision.retry_after_ns, held * SEC, "timeout {timeout}");
        assert_eq!(h.outcome(&get("/").from("192.0.2.9")).await, "proceed");
        h.advance(secs(held - 1));
        assert_eq!(h.outcome(&get("/")).await, "429:login", "timeout {timeout}");
        assert_eq!(h.counted("login", "allowed"), 2, "{timeout}: the GETs were never counted");
        h.advance(secs(1));
        assert_eq!(h.outcome(&get("/")).await, "proceed", "timeout {timeout}");
        assert_eq!(h.outcome(&post("/login")).await, "proceed", "timeout {timeout}");
    }
}

/// The manual: "a rule's `mitigation.match` says which requests are answered while the key is
/// over"; the rules' docs: `timeout` "0: only while over". Without a timeout, a key over its login
/// limit has its other requests mitigated until its limit admits again, then no longer.
#[tokio::test]
async fn without_a_timeout_mitigation_match_applies_while_the_key_is_over() {
    let h = harness(
        "[[rules]]\nname = \"login\"\nlimit = \"2/1m\"\nalgorithm = \"fixed-window\"\nkey = [\"client_ip\"]\n\
         match = { method = \"POST\", path = \"/login\" }\n[rules.mitigation]\nmatch = {}\n",
    );
    assert_eq!(h.outcomes(&post("/login"), 3).await, ["proceed", "proceed", "429:login"]);
    assert_eq!(h.outcome(&get("/")).await, "429:login", "the key is over: every request of it is mitigated");
    assert_eq!(rejected(&h, &get("/")).await.decision.retry_after_ns, 60 * SEC, "until the window ends");
    h.advance(secs(60));
    assert_eq!(h.outcome(&get("/")).await, "proceed", "no longer over");
}

/// `shadow-ban`: the configured fake success (status, body, content type; 200, empty, text/plain
/// by default) for the timeout, then admitted; a caller naming the rule is told it is denied.
#[tokio::test]
async fn shadow_ban_answers_its_fake_success_for_the_timeout() {
    let h = harness(
        "[[rules]]\nname = \"s\"\nlimit = \"2/1m\"\nkey = [\"global\"]\nmatch = { path = \"/\" }\n[rules.mitigation]\naction = \"shadow-ban\"\n\
         status = 202\nbody = '{\"ok\":true}'\ncontent_type = \"application/json\"\ntimeout = \"45s\"\n\
         [[rules]]\nname = \"plain\"\nlimit = \"1/1m\"\nkey = [\"key\"]\n[rules.mitigation]\naction = \"shadow-ban\"\n",
    );
    assert_eq!(h.outcomes(&get("/"), 3).await, ["proceed", "proceed", "shadow:s"]);
    let shadow = async || match h.admit(&get("/")).await {
        Admission::Answer(Answer::ShadowBan { status, body, content_type, fields }) => {
            (status, body, content_type, fields.policy, fields.decision.allowed, fields.decision.retry_after_ns)
        }
        other => panic!("not shadow-banned: {}", support::describe(&other)),
    };
    let expected = |retry| (202, "{\"ok\":true}".to_string(), "application/json".to_string(), "s".into(), false, retry);
    assert_eq!(shadow().await, expected(45 * SEC), "the timeout outlasts the limit's 30 s wait");
    h.advance(secs(30));
    assert_eq!(shadow().await, expected(15 * SEC), "the limit would admit: the timeout holds");
    assert_eq!(h.remaining("s", "").await, 1, "nothing charged while banned");
    h.advance(secs(15));
    assert_eq!(h.outcome(&get("/")).await, "proceed");
    assert_eq!(h.counted("s", "shadow_banned"), 3);

    let defaults = h.engine.check_named(Frontend::Http, "plain", b"k", 1).await.unwrap().0;
    assert!(defaults.allowed);
    let denied = h.engine.check_named(Frontend::Http, "plain", b"k", 1).await.unwrap().0;
    assert!(!denied.allowed, "a caller naming a shadow-ban rule is told it is denied");
    let got = match h.admit(&get("/named").key("k")).await {
        Admission::Answer(Answer::ShadowBan { status, body, content_type, .. }) => (status, body, content_type),
        other => panic!("{}", support::describe(&other)),
    };
    assert_eq!(got, (200, String::new(), "text/plain".to_string()), "the defaults");
}

const QUARANTINE: &str = "[[rules]]\nname = \"quarantine\"\nlimit = \"1/10s\"\nalgorithm = \"fixed-window\"\n\
     key = [\"global\"]\n[rules.mitigation]\naction = \"route\"\nupstream = \"http://127.0.0.1:3001\"\ntimeout = \"30s\"\n\
     [[rules]]\nname = \"per-ip\"\nlimit = \"10/1m\"\nalgorithm = \"fixed-window\"\nkey = [\"client_ip\"]\n";

/// `route` with a timeout, on a front end that routes: the key goes to the quarantine for the
/// timeout (its window admitting again meanwhile), each quarantined request still charged to the
/// other rules; on one that does not, the same requests are 429s, charged nowhere.
#[tokio::test]
async fn route_sends_the_key_to_its_quarantine_for_the_timeout_still_charged() {
    let h = routing(QUARANTINE);
    assert_eq!(h.outcomes(&get("/"), 2).await, ["proceed", "route:quarantine"]);
    h.advance(secs(15));
    let Admission::Answer(Answer::Route { upstream, fields }) = h.admit(&get("/")).await else { panic!("routed") };
    assert_eq!((upstream.as_str(), fields.decision.retry_after_ns), ("http://127.0.0.1:3001", 15 * SEC));
    assert_eq!(h.remaining("per-ip", "192.0.2.1").await, 7, "every quarantined request was charged");
    h.advance(secs(15));
    assert_eq!(h.outcome(&get("/")).await, "proceed");
    assert_eq!(h.counted("quarantine", "routed"), 2);

    let h = harness(QUARANTINE);
    assert_eq!(h.outcomes(&get("/"), 2).await, ["proceed", "429:quarantine"]);
    h.advance(secs(15));
    assert_eq!(rejected(&h, &get("/")).await.decision.retry_after_ns, 15 * SEC);
    assert_eq!(h.remaining("per-ip", "192.0.2.1").await, 9, "rejected: charged nowhere");
}

/// `dry-run` never refuses; a caller naming a dry-run rule is admitted with what the rule would
/// have said (its remaining, its retry).
#[tokio::test]
async fn dry_run_admits_and_reports_what_it_would_have_said() {
    let h = harness(
        "[[rules]]\nname = \"trial\"\nlimit = \"1/1m\"\nalgorithm = \"fixed-window\"\nkey = [\"key\"]\n\
         [rules.mitigation]\naction = \"dry-run\"\n",
    );
    let said = async || {
        let (d, _) = h.engine.check_named(Frontend::Resp, "trial", b"k", 1).await.unwrap();
        (d.allowed, d.remaining, d.retry_after_ns)
    };
    assert_eq!(said().await, (true, 0, 0));
    h.advance(secs(20));
    assert_eq!(said().await, (true, 0, 40 * SEC), "admitted, though over until the window ends");
    assert_eq!(h.outcomes(&get("/").key("k"), 3).await, ["proceed"; 3]);
    assert_eq!((h.counted("trial", "allowed"), h.counted("trial", "dry_run")), (1, 4));
}

/// The manual: `dry-run` "counts what it would enforced", and the top talkers' `limited` is true
/// while the key "would be [mitigated] under dry-run", so that "a rule on trial shows whom it would
/// limit". Enforced, this rule holds the key for its 5-minute timeout; on trial, the key reads as
/// limited and its requests count `dry_run` (charging nothing, as held ones) for those 5 minutes.
#[tokio::test]
async fn a_dry_run_rule_reports_the_timeout_it_would_hold() {
    let h = harness(
        "[[rules]]\nname = \"trial\"\nlimit = \"2/1m\"\nalgorithm = \"fixed-window\"\nkey = [\"client_ip\"]\n\
         [rules.mitigation]\naction = \"dry-run\"\ntimeout = \"5m\"\n",
    );
    assert_eq!(h.outcomes(&get("/"), 3).await, ["proceed"; 3]);
    assert_eq!(h.counted("trial", "dry_run"), 1);
    h.advance(secs(90));
    assert_eq!(h.outcome(&get("/")).await, "proceed");
    assert!(h.engine.top("trial", 1).unwrap()[0].limited, "enforced, the key would be held until +5 min");
    assert_eq!((h.counted("trial", "allowed"), h.counted("trial", "dry_run")), (2, 2));
    assert_eq!(h.remaining("trial", "192.0.2.1").await, 2, "the window admits again, but held: nothing charged");
    h.advance(secs(210));
    assert_eq!(h.outcome(&get("/")).await, "proceed");
    assert!(!h.engine.top("trial", 1).unwrap()[0].limited, "the hold is over");
    assert_eq!((h.counted("trial", "allowed"), h.counted("trial", "dry_run")), (3, 2));
}

/// `when_rate_above` with a timeout and `shadow-ban`: 10/s against 5/s is shadow-banned with its
/// limit far from reached, and held for the timeout though its rate fell back within two
/// seconds; mitigated requests charge nothing.
#[tokio::test]
async fn when_rate_above_mitigates_by_the_measured_rate_for_the_timeout() {
    let h = harness(
        "[[rules]]\nname = \"fast\"\nlimit = \"1000/1m\"\nalgorithm = \"fixed-window\"\nkey = [\"client_ip\"]\n\
         rate_half_life = \"1s\"\nwhen_rate_above = \"5/s\"\n[rules.mitigation]\naction = \"shadow-ban\"\ntimeout = \"10s\"\n",
    );
    let mut admitted = 0;
    let banned_at = loop {
        match h.outcome(&get("/")).await.as_str() {
            "proceed" => admitted += 1,
            "shadow:fast" => break h.clock.now_ns(),
            other => panic!("{other}"),
        }
        assert!(admitted < 20, "10/s never went over 5/s");
        h.advance(support::ms(100));
    };
    h.advance(secs(3));
    assert!(h.engine.top("fast", 1).unwrap()[0].rate_per_s < 5.0, "the rate fell back below the threshold");
    assert_eq!(h.outcome(&get("/")).await, "shadow:fast", "held by the timeout");
    assert_eq!(h.remaining("fast", "192.0.2.1").await, 1000 - admitted, "mitigated requests charge nothing");
    h.clock.set(banned_at + 10 * SEC);
    assert_eq!(h.outcome(&get("/")).await, "proceed");
}

/// Without a timeout, a key is held while a request of cost 1 would be refused: a bucket-family
/// rule refusing a request of cost 2 holds the key's other requests for one unit's wait (20 s),
/// not the two units that request waits for; a window refusing a cost that does not fit while a
/// unit is left holds nothing. A rule whose `mitigation.match` is its `match` holds nothing
/// either: its limit says when its key is over, and no request pays a lookup.
#[tokio::test]
async fn without_a_timeout_a_key_is_held_while_a_request_of_cost_1_is_over() {
    let rules = |algorithm: &str| {
        format!(
            "[[rules]]\nname = \"upload\"\nlimit = \"3/1m\"\nalgorithm = \"{algorithm}\"\nkey = [\"client_ip\"]\n\
             cost_header = \"x-cost\"\nmatch = {{ path = \"/upload\" }}\n[rules.mitigation]\nmatch = {{}}\n"
        )
    };
    let upload = |cost: &str| post("/upload").header("x-cost", cost);
    let h = harness(&rules("gcra"));
    assert_eq!(h.outcomes(&upload("3"), 1).await, ["proceed"]);
    assert_eq!(rejected(&h, &upload("2")).await.decision.retry_after_ns, 40 * SEC);
    assert_eq!(rejected(&h, &get("/")).await.decision.retry_after_ns, 20 * SEC, "over until one unit is back");
    h.advance(secs(20));
    assert_eq!(h.outcome(&get("/")).await, "proceed");
    assert_eq!(rejected(&h, &upload("2")).await.decision.retry_after_ns, 20 * SEC, "still over for 2");
    assert_eq!(h.outcome(&get("/")).await, "proceed", "a unit is left: not over");

    let h = harness(&rules("fixed-window"));
    assert_eq!(h.outcomes(&upload("2"), 2).await, ["proceed", "429:upload"]);
    assert_eq!(h.outcome(&get("/")).await, "proceed", "a unit is left: not over");
    assert_eq!(h.outcomes(&upload("1"), 2).await, ["proceed", "429:upload"]);
    assert_eq!(rejected(&h, &get("/")).await.decision.retry_after_ns, 60 * SEC, "over until the window ends");

    let h = harness("[[rules]]\nname = \"plain\"\nlimit = \"1/1m\"\nkey = [\"client_ip\"]\n");
    assert_eq!(h.outcomes(&get("/"), 2).await, ["proceed", "429:plain"]);
    assert_eq!(h.series("tollgate_blocked_keys"), 0, "nothing held: the limit decides every request it mitigates");
}

/// Without a timeout, the requests a rule counts are decided by its limit, not by the hold: a
/// login refused while two others were in flight passes once their successes are refunded. That
/// refusal held nothing (only the reservations in flight refused it: not over); two failures
/// counted do, while over.
#[tokio::test]
async fn without_a_timeout_the_limit_decides_the_requests_it_counts() {
    let h = harness(
        "[[rules]]\nname = \"login\"\nlimit = \"2/1m\"\nalgorithm = \"fixed-window\"\nkey = [\"client_ip\"]\n\
         count_status = [401]\nmatch = { method = \"POST\", path = \"/login\" }\n[rules.mitigation]\nmatch = {}\n",
    );
    let in_flight = [h.proceed(&post("/login")).await, h.proceed(&post("/login")).await];
    assert_eq!(h.outcome(&post("/login")).await, "429:login");
    assert_eq!(h.outcome(&get("/")).await, "proceed", "refused by those in flight only: nothing held");
    for proceed in in_flight {
        h.engine.complete(proceed.pending, 200).await;
    }
    let failures = [h.proceed(&post("/login")).await, h.proceed(&post("/login")).await];
    for proceed in failures {
        h.engine.complete(proceed.pending, 401).await;
    }
    assert_eq!(h.outcome(&post("/login")).await, "429:login");
    assert_eq!(h.outcome(&get("/")).await, "429:login", "over: held");
}

/// A dry-run rule over its `when_rate_above` holds the key for its `timeout`, as enforced it
/// would: reported limited and counted `dry_run` meanwhile, each request once, charging nothing.
#[tokio::test]
async fn a_dry_run_rule_over_its_rate_reports_the_timeout_it_would_hold() {
    let h = harness(
        "[[rules]]\nname = \"fast\"\nlimit = \"1000/1m\"\nalgorithm = \"fixed-window\"\nkey = [\"client_ip\"]\n\
         rate_half_life = \"1s\"\nwhen_rate_above = \"5/s\"\n[rules.mitigation]\naction = \"dry-run\"\ntimeout = \"10s\"\n",
    );
    let mut sent = 0;
    let flagged_at = loop {
        assert_eq!(h.outcome(&get("/")).await, "proceed");
        sent += 1;
        if h.counted("fast", "dry_run") == 1 {
            break h.clock.now_ns();
        }
        assert!(sent < 20, "10/s never went over 5/s");
        h.advance(support::ms(100));
    };
    h.advance(secs(3));
    assert!(h.engine.top("fast", 1).unwrap()[0].rate_per_s < 5.0, "the rate fell back below the threshold");
    assert_eq!(h.outcome(&get("/")).await, "proceed");
    assert!(h.engine.top("fast", 1).unwrap()[0].limited, "enforced, the key would be held");
    assert_eq!((h.counted("fast", "allowed"), h.counted("fast", "dry_run")), (sent - 1, 2));
    assert_eq!(h.remaining("fast", "192.0.2.1").await, 1000 - sent, "the held request charged nothing");
    h.clock.set(flagged_at + 10 * SEC);
    assert_eq!(h.outcome(&get("/")).await, "proceed");
    assert_eq!((h.counted("fast", "allowed"), h.counted("fast", "dry_run")), (sent, 2));
}
