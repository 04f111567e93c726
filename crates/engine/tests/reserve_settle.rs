//! Reserve → settle at the engine, on the memory store and on a real Redis shared by two engines
//! (a fleet): named limits (in their own scope, a held key denied) and ad-hoc limits, all or
//! nothing; a settle through another engine than the one that reserved; refusals; and the
//! reservations' metrics (opened, denied, settled by estimate, refusals, open, expired).

mod support;

use std::sync::Arc;
use std::time::Duration;

use support::{Harness, SEC, T0, build, clock, memory};
use tollgate_core::{Algorithm, Clock, Limit, ManualClock};
use tollgate_engine::{EngineError, Frontend, Reserving};
use tollgate_store::testkit::redis_server::RedisServer;
use tollgate_store::{RedisOptions, RedisStore, Refusal, Store, StoreError, TimeSource};

const RULES: &str = "[[rules]]\nname = \"tokens\"\nlimit = \"100/1h\"\nalgorithm = \"fixed-window\"\nkey = [\"key\"]\n\
     [[rules]]\nname = \"by_ip\"\nlimit = \"100/1h\"\nkey = [\"client_ip\"]\n";

fn named() -> Vec<Reserving> {
    vec![Reserving::Named("tokens".into())]
}

/// Reserve, settle above and below, refusals, all or nothing with an ad-hoc limit; `other`
/// settles what `engine` reserved (the same engine on memory).
async fn reserves_and_settles<S: Store>(h: &Harness<S>, other: &Harness<S>) {
    let reserve = |limits: Vec<Reserving>, estimate| async move {
        h.engine.reserve(Frontend::Http, &limits, b"acct", estimate, Duration::from_secs(30)).await
    };
    let r = reserve(named(), 40).await.unwrap();
    assert!(r.decision.allowed && r.decision.remaining == 60, "{r:?}");
    assert_eq!(r.name.as_deref(), Some("tokens"));
    let id = r.reservation.unwrap().id;
    let settled = other.engine.settle_reservation(Frontend::Resp, &id, 55).await.unwrap();
    assert_eq!((settled.estimate, settled.actual), (40, 55));
    let again = h.engine.settle_reservation(Frontend::Http, &id, 55).await;
    assert!(matches!(again, Err(EngineError::Store(StoreError::Refused(Refusal::AlreadySettled(_))))), "{again:?}");

    // 45 left; an ad-hoc limit with room and the named one without: nothing charged.
    let tight = Limit::per_hour(1_000).algorithm(Algorithm::FixedWindow).build().unwrap();
    let both = vec![Reserving::Named("tokens".into()), Reserving::Limit(tight.clone())];
    let denied = reserve(both.clone(), 50).await.unwrap();
    assert!(!denied.decision.allowed && denied.reservation.is_none() && denied.name.as_deref() == Some("tokens"));
    let r = reserve(both, 45).await.unwrap();
    assert_eq!(r.decision.remaining, 0, "the tightest decision: {r:?}");
    h.engine.settle_reservation(Frontend::Http, &r.reservation.unwrap().id, 5).await.unwrap();
    let r = reserve(vec![Reserving::Limit(tight)], 1).await.unwrap();
    assert_eq!(r.decision.remaining, 1_000 - 5 - 1, "the ad-hoc limit settled to 5 too");

    // Refused: a rule not keyed on the caller's key, an unknown one.
    let by_ip = reserve(vec![Reserving::Named("by_ip".into())], 1).await;
    assert!(matches!(by_ip, Err(EngineError::NotByName(_))), "{by_ip:?}");
    assert!(matches!(reserve(vec![Reserving::Named("nope".into())], 1).await, Err(EngineError::UnknownRule(_))));

    // Expired: never settled, counted at its estimate; this engine counts it expired.
    let r = reserve(named(), 10).await.unwrap();
    let id = r.reservation.unwrap().id;
    h.clock.advance(Duration::from_secs(31));
    other.clock.set(h.clock.now_ns());
    let late = h.engine.settle_reservation(Frontend::Http, &id, 0).await;
    assert!(matches!(late, Err(EngineError::Store(StoreError::Refused(Refusal::Expired(_))))), "{late:?}");

    let m = |s: &str| h.series(s);
    assert_eq!(m("tollgate_reservations_total{event=\"denied\"}"), 1);
    assert_eq!(m("tollgate_reservations_total{event=\"settled_already\"}"), 1);
    assert_eq!(m("tollgate_reservations_total{event=\"expired\"}"), 1);
    assert_eq!(m("tollgate_reservation_settles_total{estimate=\"over\"}"), 1);
    assert_eq!(m("tollgate_reservations_open"), 0);
}

#[tokio::test]
async fn an_engine_reserves_and_settles_on_memory() {
    let clock = clock();
    let h = build(memory(&clock), clock, RULES, false);
    reserves_and_settles(&h, &h).await;
    assert_eq!(h.series("tollgate_reservations_total{event=\"opened\"}"), 4);
    assert_eq!(h.series("tollgate_reservations_total{event=\"settled\"}"), 2);
    assert_eq!(h.series("tollgate_reservation_settles_total{estimate=\"under\"}"), 1);
    // The ad-hoc reservation never settled; the one refused as expired is closed by the refusal.
    assert_eq!(h.series("tollgate_reservations_expired_total"), 1);
}

#[tokio::test]
async fn two_engines_on_redis_settle_what_the_other_reserved() {
    let server = RedisServer::start();
    let node = |clock: Arc<ManualClock>| {
        let options = RedisOptions {
            prefix: "fleet".into(),
            time: TimeSource::Clock(clock.clone()),
            timeout: Duration::from_secs(2),
            ..RedisOptions::default()
        };
        build(RedisStore::open(&server.url(), options).unwrap(), clock, RULES, false)
    };
    let (a, b) = (node(clock()), node(clock()));
    reserves_and_settles(&a, &b).await;
    assert_eq!(b.series("tollgate_reservation_settles_total{estimate=\"under\"}"), 1, "settled on b");
    assert_eq!(a.series("tollgate_reservations_total{event=\"opened\"}"), 4);
    // The ad-hoc one never settled (the one b settled, a closed when its own settle was refused).
    assert_eq!(a.series("tollgate_reservations_expired_total"), 1, "{}", a.metrics());
    a.clock.set(T0 + 100 * SEC);
    let r = a.engine.reserve(Frontend::Http, &named(), b"other", 1, Duration::from_secs(1)).await.unwrap();
    assert!(r.reservation.is_some());
    assert_eq!(a.series("tollgate_reservations_open"), 1);
}

/// A named limit's key held by its mitigation (its `timeout`) is denied a reservation, though its
/// limit has room again; nothing is charged.
#[tokio::test]
async fn a_key_held_by_its_mitigation_is_denied_a_reservation() {
    let rules =
        "[[rules]]\nname = \"login\"\nlimit = \"2/1m\"\nkey = [\"key\"]\n[rules.mitigation]\ntimeout = \"1h\"\n";
    let clock = clock();
    let h = build(memory(&clock), clock, rules, false);
    let login = vec![Reserving::Named("login".into())];
    for _ in 0..3 {
        h.engine.check_named(Frontend::Resp, "login", b"u", 1).await.unwrap();
    }
    h.clock.advance(Duration::from_secs(120));
    let r = h.engine.reserve(Frontend::Http, &login, b"u", 1, Duration::from_secs(10)).await.unwrap();
    assert!(!r.decision.allowed && r.reservation.is_none(), "held: {r:?}");
    let other = h.engine.reserve(Frontend::Http, &login, b"v", 1, Duration::from_secs(10)).await.unwrap();
    assert!(other.reservation.is_some(), "another key is not held");
}

/// `tollgate_reservations_open` counts reservations "whose deadline has not passed", and
/// `_expired_total` those whose deadline passed unsettled: a scrape after the deadlines, with no
/// reserve or settle since, must not show them open still (a node whose traffic stopped would
/// report its last open count for ever, and never count them expired).
#[tokio::test]
async fn a_scrape_after_the_deadlines_shows_no_reservation_open() {
    let clock = clock();
    let h = build(memory(&clock), clock, RULES, false);
    for key in [&b"a"[..], b"b", b"c"] {
        let r = h.engine.reserve(Frontend::Http, &named(), key, 1, Duration::from_secs(10)).await.unwrap();
        assert!(r.reservation.is_some());
    }
    assert_eq!(h.series("tollgate_reservations_open"), 3);
    h.clock.advance(Duration::from_secs(60));
    assert_eq!(
        (h.series("tollgate_reservations_open"), h.series("tollgate_reservations_expired_total")),
        (0, 3),
        "(open, expired) a minute after three reservations of 10 s, none settled"
    );
}

/// "Every front end, one admission" (docs/rules.md): a rule on trial (`dry-run`) never refuses,
/// and `TG.LIMIT` naming it answers admitted; a reservation under it must be admitted too
/// (docs/reservations.md: "told admitted or denied, as with `TG.LIMIT`"), not denied by a rule
/// that only reports.
#[tokio::test]
async fn a_rule_on_trial_never_denies_a_reservation_as_it_never_denies_tg_limit() {
    let rules = "[[rules]]\nname = \"trial\"\nlimit = \"2/1h\"\nalgorithm = \"fixed-window\"\nkey = [\"key\"]\n\
                 [rules.mitigation]\naction = \"dry-run\"\n";
    let clock = clock();
    let h = build(memory(&clock), clock, rules, false);
    for _ in 0..3 {
        let (decision, _) = h.engine.check_named(Frontend::Resp, "trial", b"u", 1).await.unwrap();
        assert!(decision.allowed, "a dry-run rule admits TG.LIMIT: {decision:?}");
    }
    let trial = vec![Reserving::Named("trial".into())];
    let r = h.engine.reserve(Frontend::Http, &trial, b"u", 1, Duration::from_secs(10)).await.unwrap();
    assert!(r.reservation.is_some(), "TG.LIMIT admits under the dry-run rule, the reservation is denied: {r:?}");
}

/// A `token-bucket` delay rule keeps its schedule as GCRA (docs/rules.md): `TG.LIMIT` naming it
/// decides on that schedule. A reservation under it must charge the same state, so that what it
/// reserved is seen by the rule's requests; here the whole burst reserved still leaves a peek
/// of `TG.LIMIT` reporting the full burst.
#[tokio::test]
async fn a_reservation_under_a_delay_rule_charges_the_state_its_requests_see() {
    let rules = "[[rules]]\nname = \"shaped\"\nlimit = \"10/1h\"\nalgorithm = \"token-bucket\"\nburst = 10\n\
                 key = [\"key\"]\n[rules.mitigation]\naction = \"delay\"\n";
    let clock = clock();
    let h = build(memory(&clock), clock, rules, false);
    let shaped = vec![Reserving::Named("shaped".into())];
    let r = h.engine.reserve(Frontend::Http, &shaped, b"u", 10, Duration::from_secs(10)).await.unwrap();
    assert!(r.reservation.is_some(), "{r:?}");
    let (peek, _) = h.engine.check_named(Frontend::Resp, "shaped", b"u", 0).await.unwrap();
    assert_eq!(peek.remaining, 0, "after a reservation of the whole burst, TG.LIMIT's peek of the rule: {peek:?}");
}

/// A reload that changes a rule's algorithm carries each key's use into the new algorithm's
/// state on the key's first request after it (engine's `carry`), `TG.LIMIT` included. A
/// reservation is such a first request: it must be decided on the carried use, not on an empty
/// state (a key that spent its limit would be granted a second one).
#[tokio::test]
async fn a_reservation_after_a_reload_that_changed_the_algorithm_sees_the_carried_use() {
    let before = "[[rules]]\nname = \"tokens\"\nlimit = \"10/1h\"\nalgorithm = \"fixed-window\"\nkey = [\"key\"]\n";
    let after = "[[rules]]\nname = \"tokens\"\nlimit = \"10/1h\"\nalgorithm = \"sliding-window\"\nkey = [\"key\"]\n";
    let clock = clock();
    let h = build(memory(&clock), clock, before, false);
    for key in [&b"u"[..], b"v"] {
        let (spent, _) = h.engine.check_named(Frontend::Resp, "tokens", key, 10).await.unwrap();
        assert!(spent.allowed && spent.remaining == 0, "{spent:?}");
    }
    h.engine.reload(tollgate_rules::Rules::parse(after, "after").unwrap());
    let (limited, _) = h.engine.check_named(Frontend::Resp, "tokens", b"v", 1).await.unwrap();
    assert!(!limited.allowed, "TG.LIMIT after the reload sees the carried use: {limited:?}");
    let r = h.engine.reserve(Frontend::Http, &named(), b"u", 10, Duration::from_secs(10)).await.unwrap();
    assert!(
        r.reservation.is_none() && !r.decision.allowed,
        "a key that spent its 10 before the reload was granted a reservation of 10 after it: {r:?}"
    );
}
